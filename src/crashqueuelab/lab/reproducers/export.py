"""A shrunk failure as a standalone pytest file, and the run that shows what it does.

The file imports only ``crashqueuelab.regression`` (the public API) and pytest, and names
the system as it was given (``module:factory``, a shipped name, a pinned release);
``CRASHQUEUELAB_SYSTEM`` points it at another system, which is how the lab shows it passing
on a correct one. It runs as a user runs it, from any directory: it records the directory
its adapter was imported from (``IMPORT_PATH``), and a pinned release's rerun goes to the
release's environment (``preparation``). The rerun is made in a fixture, so a system that
cannot be set up is a pytest error, never the failure that says the bug is there.

A failure the system's documentation explains (``lab.runs.promises``) is not offered as a
bug to fix: its test pins the documented behaviour as a strict expected failure, with the
documentation's words and link (``DocumentedWeakness``). Beside the files, a ``pytest.ini``
makes the directory a project of its own, so neither the lab's nor the user's settings
change what they do.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from crashqueuelab.lab.runs import commands
from crashqueuelab.lab.runs.servers import SERVER_VARIABLES

#: What a reproducer's test file rerun is allowed before it counts as not finishing.
PYTEST_SECONDS = 600
INI_FILE = "pytest.ini"
SYSTEM_VARIABLE = "CRASHQUEUELAB_SYSTEM"
#: pytest loads no plugin it was not named on the command line: the file needs none, and
#: the run shows it. It also keeps each run short: hypothesis's plugin alone (the lab's dev
#: extra installs it) imports all of hypothesis, about a second of a two-second run.
NO_PLUGINS = "PYTEST_DISABLE_PLUGIN_AUTOLOAD"

_HEADER = '''"""Exported by crashqueuelab from a failing run: {summary}

System: {system}
It failed with: {anomaly}
Shrunk from {before} to {after}; rerun {confirmations} times, it failed {reproduced}.

{meaning}

It uses only crashqueuelab's public API; set {variable}=package.module:factory to run it
against another system. A system that cannot be set up here is an error of the test, never
its failure.
"""

import os
from pathlib import Path

import pytest

from crashqueuelab.regression import {imports}

SYSTEM = os.environ.get("{variable}", {system_literal})
#: The directory the system's module was imported from when this test was exported (None:
#: Python finds it by itself); put on Python's path when it is there.
IMPORT_PATH = {import_path}
'''

_BUG = "This test fails while the system has the bug and passes once it is fixed."

_DOCUMENTED = """The system documents this behaviour: it is weaker than the lab's contract, not a
bug to fix. The test pins it: an expected failure (strict xfail) while the documented
weakness shows; it fails when a failure no documentation explains shows up, and when the
weakness no longer shows (then the documentation, or this test, is out of date).
{what}
{source}"""

_FIXTURE = """

@pytest.fixture
def outcome(tmp_path: Path) -> Outcome:
    return {call}
"""

_BUG_TEST = """

def {name}(outcome: Outcome) -> None:
    assert outcome.ok, outcome.explain()
"""

_DOCUMENTED_TEST = """

@pytest.mark.xfail(
    raises=DocumentedWeakness, strict=True, reason=f"documented: {{WEAKNESS}} ({{SOURCE}})"
)
def {name}(outcome: Outcome) -> None:
    outcome.assert_documented(WEAKNESS)
"""


def function_name(*parts: str) -> str:
    """A pytest function name from words: lower case, letters, digits and underscores."""
    name = "test"
    for word in re.findall(r"[a-z0-9]+", " ".join(parts).lower()):
        if len(name) + 1 + len(word) > 72:
            break
        name += "_" + word
    return name


def literal(value: Any, indent: int = 0) -> str:
    """``value`` (JSON data without booleans or nulls) as Python source in the layout a
    formatter keeps: a dict or a list of lists one item per line with trailing commas, a
    list of numbers on one line."""
    pad = " " * (indent + 4)
    if isinstance(value, dict):
        items = "".join(
            f"{pad}{json.dumps(k)}: {literal(v, indent + 4)},\n" for k, v in value.items()
        )
        return "{\n" + items + " " * indent + "}"
    if isinstance(value, list) and any(isinstance(item, list | dict) for item in value):
        items = "".join(f"{pad}{literal(item, indent + 4)},\n" for item in value)
        return "[\n" + items + " " * indent + "]"
    return json.dumps(value)


def call_text(function: str, *arguments: str) -> str:
    """``function(arguments)`` as the fixture's return expression, one argument a line
    when they do not fit on one."""
    one_line = f"{function}({', '.join(arguments)})"
    if len(one_line) <= 80:
        return one_line
    return f"{function}(\n" + "".join(f"        {argument},\n" for argument in arguments) + "    )"


def render(
    *,
    name: str,
    function: str,
    call: str,
    record: Mapping[str, Any],
    import_path: str | None,
    constants: Mapping[str, Any] | None = None,
) -> str:
    """The test file's text: ``call`` is the expression of the rerun (it may name
    ``SYSTEM``, ``IMPORT_PATH``, ``tmp_path`` and the ``constants``); a record whose
    ``documented`` names a weakness gets the test that pins it."""
    documented = record.get("documented")
    imports = ["Outcome", function]
    meaning = _BUG
    if documented:
        imports.append("DocumentedWeakness")
        meaning = _DOCUMENTED.format(what=_wrapped(documented["what"]), source=documented["source"])
    text = _HEADER.format(
        summary=record["summary"],
        system=record["system"],
        anomaly=record["anomaly"],
        before=record["before"]["what"],
        after=record["after"]["what"],
        confirmations=record["confirmations"],
        reproduced=f"{record['reproduced']} of {record['confirmations']}",
        meaning=meaning,
        variable=SYSTEM_VARIABLE,
        imports=", ".join(sorted(imports)),
        system_literal=json.dumps(record["system"]),
        import_path=json.dumps(import_path) if import_path else "None",
    )
    if documented:
        text += f"WEAKNESS = {json.dumps(documented['what'])}\n"
        text += f"SOURCE = {json.dumps(documented['source'])}\n"
    for constant, value in (constants or {}).items():
        text += f"{constant} = {literal(value)}\n"
    text += _FIXTURE.format(call=call)
    return text + (_DOCUMENTED_TEST if documented else _BUG_TEST).format(name=name)


def _wrapped(text: str, width: int = 88) -> str:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "\n".join([*lines, line])


def write_test(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    ini = directory / INI_FILE
    if not ini.exists():
        ini.write_text("[pytest]\naddopts = -ra\n", encoding="utf-8")
    path = directory / f"{name}.py"
    path.write_text(text, encoding="utf-8")
    return path


#: What pytest said of the one test in an exported file, from its closing lines.
FAILED, PASSED, EXPECTED, UNEXPECTED, ERROR, SKIPPED = (
    "failed", "passed", "expected failure", "unexpected pass", "error", "skipped",
)  # fmt: skip


def run_test(path: Path, *, import_path: str | None, system: str | None = None) -> dict[str, Any]:
    """Run the exported file with pytest in a process of its own, as a user runs it: from
    its own directory, without the directory its system was imported from
    (``import_path``) on ``PYTHONPATH``, without the run's servers and without the plugins
    installed beside pytest (``NO_PLUGINS``); its output is kept beside it. ``outcome`` is
    what pytest said of the test (``failed``, ``passed``, ``expected failure``,
    ``unexpected pass``, ``error``, ``skipped``), None when pytest could not run it (not
    installed, the file broken, no time left); ``failed`` is True for a failure, False for
    a pass, None otherwise. ``system`` runs it against another
    system (the correct one), importable from where the lab finds it."""
    # pytest runs from the file's own directory: a path relative to this one (a run's
    # relative --output-directory) would name a file that is not there.
    path = path.absolute()
    label = "as-exported" if system is None else "against-" + re.sub(r"[^\w.-]+", "-", system)
    output = path.with_name(f"{path.stem}.{label}.txt")
    if importlib.util.find_spec("pytest") is None:
        return _not_run("not run: pytest is not installed")
    # An exported test starts the servers it needs, as it does in a user's suite.
    env = {name: value for name, value in os.environ.items() if name not in SERVER_VARIABLES}
    hidden = {str(Path(import_path).resolve())} if import_path else set()
    kept = [entry for entry in env.pop("PYTHONPATH", "").split(os.pathsep)
            if entry and str(Path(entry).resolve()) not in hidden]  # fmt: skip
    env.pop(SYSTEM_VARIABLE, None)
    env[NO_PLUGINS] = "1"
    if system is not None:
        env[SYSTEM_VARIABLE] = system
        kept.insert(0, commands.import_path(system) or "")
    if any(kept):
        env["PYTHONPATH"] = os.pathsep.join(filter(None, kept))
    command = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
        "-c", str(path.parent / INI_FILE), "--rootdir", str(path.parent), str(path),
    ]  # fmt: skip
    try:
        finished = subprocess.run(
            command, capture_output=True, text=True, env=env, cwd=path.parent,
            timeout=PYTEST_SECONDS, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return _not_run(f"pytest ran past {PYTEST_SECONDS} s")
    text = finished.stdout + finished.stderr
    output.write_text(text, encoding="utf-8")
    outcome = _outcome(finished.returncode, finished.stdout)
    last = (finished.stdout.strip().splitlines() or ["(no output)"])[-1]
    detail = last if outcome is not None else f"pytest exited {finished.returncode}: {last}"
    if outcome == ERROR:
        detail = _error_line(finished.stdout) or last
    return {
        "outcome": outcome,
        "failed": {FAILED: True, PASSED: False}.get(outcome or ""),
        "detail": detail,
        "output": output.name,
    }


def _not_run(detail: str) -> dict[str, Any]:
    return {"outcome": None, "failed": None, "detail": detail, "output": None}


def _outcome(code: int, stdout: str) -> str | None:
    """What pytest's closing line says of the file's one test; None when it ran none."""
    if code not in (0, 1):
        return None
    last = (stdout.strip().splitlines() or [""])[-1]
    said = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", last)}
    if said.get("error") or said.get("errors"):
        return ERROR
    if said.get("failed"):
        return UNEXPECTED if "[XPASS(strict)]" in stdout else FAILED
    for word, outcome in (("xfailed", EXPECTED), ("passed", PASSED), ("skipped", SKIPPED)):
        if said.get(word):
            return outcome
    return None


def _error_line(stdout: str) -> str | None:
    """What stopped the test from being set up: the last line of pytest's report of the
    error, the exception named without its module."""
    lines = [line[1:].strip() for line in stdout.splitlines() if line.startswith("E ")]
    return re.sub(r"^(?:\w+\.)+(?=\w+: )", "", lines[-1]) if lines else None


def said(run: Mapping[str, Any]) -> str:
    """What a test run of an exported file showed, in the words a page and a terminal use."""
    outcome = run.get("outcome", {True: FAILED, False: PASSED}.get(run["failed"]))
    return {
        FAILED: "fails as exported",
        EXPECTED: "fails as documented (an expected failure)",
        PASSED: "PASSES as exported",
        UNEXPECTED: "PASSES: the documented weakness no longer shows (strict xfail: the test"
        " fails)",
        ERROR: f"ERROR as exported, the system was not set up: {run['detail']}",
        SKIPPED: f"skipped as exported: {run['detail']}",
    }.get(outcome or "", str(run["detail"]))
