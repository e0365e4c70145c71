"""The docs stay true to the code: every command, invariant and exit code is documented."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab import cli
from crashqueuelab.judges.invariants import invariant_names
from tests.conftest import DOCS, SHOWCASE_SEED


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


def test_every_command_is_documented_and_has_help() -> None:
    text = (DOCS / "cli.md").read_text()
    for name, sub in _subcommands().items():
        assert f"`{name}`" in text, f"docs/cli.md does not document {name}"
        assert sub.description, f"{name} has no help text"


def test_every_exit_code_is_documented() -> None:
    text = (DOCS / "cli.md").read_text()
    for name in (
        "EXIT_OK", "EXIT_REJECTED", "EXIT_USAGE", "EXIT_STORE", "EXIT_UNAVAILABLE",
        "EXIT_INTERRUPTED",
    ):  # fmt: skip
        assert f"| {getattr(cli, name)} | `{name}` |" in text


def test_every_invariant_is_documented() -> None:
    text = (DOCS / "correctness.md").read_text()
    for name in invariant_names():
        assert f"| `{name}` |" in text, f"docs/correctness.md does not explain {name}"


def test_every_walqueue_hook_phase_is_documented() -> None:
    import re

    import walqueue.store

    source = Path(walqueue.store.__file__).read_text()
    phases = set(re.findall(r'self\.hook\("([a-z_:]+)"\)', source))
    assert len(phases) >= 20
    text = (DOCS / "walqueue.md").read_text()
    for phase in phases:
        assert f"| `{phase}` |" in text, f"docs/walqueue.md does not document {phase}"


def test_walqueue_imports_nothing_of_crashqueuelab() -> None:
    import ast

    import walqueue

    for source in Path(walqueue.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("crashqueuelab"), source.name
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("crashqueuelab") for a in node.names)


def test_every_crash_point_of_every_shipped_system_is_explained() -> None:
    from crashqueuelab.systems import resolve_system

    text = (DOCS / "fault-model.md").read_text()
    for name in ("sqlite", "walqueue", "persist-queue"):
        for point in resolve_system(name).crash_points:
            assert f"| `{point.name}` |" in text, f"docs/fault-model.md: {name} {point.name}"


def test_every_error_type_a_user_can_see_is_listed() -> None:
    import inspect

    from crashqueuelab.core import errors

    text = (DOCS / "cli.md").read_text()
    kinds = {
        cls.kind
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.CrashQueueLabError) and cls.kind != "CrashQueueLabError"
    }
    # Raised inside the lab, never out of the command line: the lab never asks a system for
    # a heartbeat its capabilities say it lacks.
    kinds -= {"OperationUnsupported"}
    for kind in sorted(kinds | {"UsageError", "SQLiteError", "OSError"}):
        assert f"| `{kind}` |" in text, f"docs/cli.md does not list {kind}"


def test_the_docs_call_the_command_one_way() -> None:
    """README and docs (the history in the performance journal aside) run the command as
    .venv/bin/crashqueuelab, Python as .venv/bin/python, pip as .venv/bin/pip."""
    root = DOCS.parent
    pages = [root / "README.md", *(p for p in DOCS.glob("*.md") if "journal" not in p.name)]
    other_ways = re.compile(
        r"(?m)(^\s*(\$ )?([A-Z_]+=\S+ )*crashqueuelab [a-z]|(?<![\w./-])`crashqueuelab [a-z]"
        r"|python3? -m crashqueuelab [a-z]|(?<![\w./-])pip install -e"
        r"|(?<![\w./-])python3? benchmarks/)"
    )
    for page in pages:
        found = other_ways.findall(page.read_text())
        assert not found, f"{page.name} calls a command another way: {found[:3]}"


def test_the_docs_index_links_every_doc() -> None:
    index = (DOCS / "README.md").read_text()
    for page in DOCS.glob("*.md"):
        if page.name != "README.md":
            assert f"]({page.name}" in index, f"docs/README.md does not link {page.name}"


#: Paths the docs name that are the reader's own, not the project's.
READERS_PATHS = {"myqueue/lab_adapter.py"}


def test_every_python_file_the_docs_name_exists() -> None:
    """A doc that names a module names one that is there: by its path (from the checkout,
    or inside any package of src/ or tests/), or by its bare file name."""
    root = DOCS.parent
    files = [p for top in ("src", "tests", "scripts", "benchmarks", "examples")
             for p in (root / top).rglob("*.py")]  # fmt: skip
    relative = {path.relative_to(root).as_posix() for path in files}
    names = {path.name for path in files}
    missing = []
    for doc in [root / "README.md", *sorted(DOCS.glob("*.md"))]:
        for found in re.finditer(r"`([A-Za-z0-9_./-]+\.py)(?::\d+)?`", doc.read_text()):
            named = found.group(1)
            if named in READERS_PATHS:
                continue
            known = (
                any(path == named or path.endswith("/" + named) for path in relative)
                if "/" in named
                else named in names
            )
            if not known:
                missing.append(f"{doc.name}: {named}")
    assert missing == []


#: What a run prints that no seed fixes: how long it took, and where it wrote.
UNFIXED = {"seconds", "report"}


def _differences(shown: Any, printed: Any, where: str) -> Iterator[str]:
    """Each value of ``shown`` (a part of ``printed``) that ``printed`` does not hold."""
    if isinstance(shown, dict):
        if not isinstance(printed, dict):
            yield f"{where}: {printed!r} is not an object"
            return
        for key, value in shown.items():
            if key in UNFIXED:
                continue
            if key not in printed:
                yield f"{where}.{key}: not printed"
                continue
            yield from _differences(value, printed[key], f"{where}.{key}")
    elif shown != printed:
        yield f"{where}: the README shows {shown!r}, the showcase printed {printed!r}"


def test_the_readme_shows_what_a_fresh_showcase_prints(
    showcase_run: tuple[int, dict[str, object], Path],
) -> None:
    """Every value of the README's showcase output, timings and paths aside, is what a
    showcase with the README's seed prints today."""
    code, printed, _ = showcase_run
    readme = (DOCS.parent / "README.md").read_text()
    block = readme.split("```json\n", 1)[1].split("\n```", 1)[0]
    shown = json.loads(block)
    assert shown["seed"] == SHOWCASE_SEED
    if printed.get("power_loss") != "ran":
        pytest.skip("this machine cannot cut the power: the README's run could")
    assert code == 0
    assert list(_differences(shown, printed, "showcase")) == []
