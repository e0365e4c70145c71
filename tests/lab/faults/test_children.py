"""Crash children: each forked from the run's fork server, each death told to its parent
as it was, also when cases start and end at once on several threads."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from crashqueuelab.lab.faults.children import CHILD_STDERR, CRASH_EXIT_CODE, spawn_child


def dies_at_once(arguments: list[str]) -> int:
    """A crash child that dies as soon as it runs (so its death races the next start)."""
    os._exit(CRASH_EXIT_CODE)


def says_and_returns(arguments: list[str]) -> int:
    print("arguments:", " ".join(arguments), flush=True)
    return 3


def test_every_death_is_told_as_it_was_while_other_threads_start_children(
    tmp_path: Path,
) -> None:
    def one(index: int) -> int | None:
        case = tmp_path / f"case-{index}"
        case.mkdir()
        return spawn_child(case, dies_at_once, [], timeout_s=60).exit_code

    with ThreadPoolExecutor(max_workers=4) as pool:
        codes = list(pool.map(one, range(300)))
    assert codes == [CRASH_EXIT_CODE] * 300


def test_a_child_gets_its_case_directory_and_arguments_and_its_output_is_kept(
    tmp_path: Path,
) -> None:
    run = spawn_child(tmp_path, says_and_returns, ["--seed", "3"], timeout_s=60)
    assert (run.exit_code, run.timed_out) == (3, False)
    said = (tmp_path / CHILD_STDERR).read_text()
    assert said == f"arguments: --case-dir {tmp_path} --seed 3\n"
