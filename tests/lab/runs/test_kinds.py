"""One registry of run kinds: every kind is a command of the command line, has a view on
the pages, and is known by its record alone."""

from __future__ import annotations

import argparse
from pathlib import Path

from crashqueuelab import cli
from crashqueuelab.lab.pages.render import VIEWS
from crashqueuelab.lab.runs.kinds import CHAOS, KINDS, kind_of


def test_every_kind_is_a_command_and_has_a_view() -> None:
    parser = cli.build_parser()
    commands = next(
        action.choices
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    for kind in KINDS:
        assert kind.command in commands, kind
        assert kind in VIEWS, kind
    assert set(VIEWS) == set(KINDS)
    assert len({kind.record for kind in KINDS}) == len(KINDS)


def test_a_directory_is_known_by_its_record(tmp_path: Path) -> None:
    assert kind_of(tmp_path) is None
    (tmp_path / CHAOS.record).write_text("{}")
    assert kind_of(tmp_path) is CHAOS
