"""A shrunk failure as a standalone pytest file, and the run that shows it fails.

The file imports only ``crashqueuelab.regression`` (the public API) and names the system as
``module:factory``; ``CRASHQUEUELAB_SYSTEM`` points it at another system, which is how the
lab shows it passing on a correct one. Beside it, a ``pytest.ini`` makes the directory a
project of its own, so neither the lab's nor the user's settings change what it does.
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

#: What a reproducer's test file rerun is allowed before it counts as not finishing.
PYTEST_SECONDS = 600
INI_FILE = "pytest.ini"
SYSTEM_VARIABLE = "CRASHQUEUELAB_SYSTEM"

_HEADER = '''"""Exported by crashqueuelab from a failing run: {summary}

System: {system}
It failed with: {anomaly}
Shrunk from {before} to {after}; rerun {confirmations} times, it failed {reproduced}.

This test fails while the system has the bug and passes once it is fixed. It uses only
crashqueuelab's public API; set {variable}=package.module:factory to run it
against another system.
"""

import os
from pathlib import Path

from crashqueuelab.regression import {function}

SYSTEM = os.environ.get("{variable}", {system_literal})
'''

_BODY = """

def {name}(tmp_path: Path) -> None:
    outcome = {call}
    assert outcome.ok, outcome.explain()
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


def render(
    *,
    name: str,
    function: str,
    call: str,
    record: Mapping[str, Any],
    constants: Mapping[str, Any] | None = None,
) -> str:
    """The test file's text: ``call`` is the expression whose outcome must be ok."""
    text = _HEADER.format(
        summary=record["summary"],
        system=record["system"],
        anomaly=record["anomaly"],
        before=record["before"]["what"],
        after=record["after"]["what"],
        confirmations=record["confirmations"],
        reproduced=f"{record['reproduced']} of {record['confirmations']}",
        variable=SYSTEM_VARIABLE,
        function=function,
        system_literal=json.dumps(record["system"]),
    )
    for constant, value in (constants or {}).items():
        text += f"{constant} = {literal(value)}\n"
    return text + _BODY.format(name=name, call=call)


def write_test(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    ini = directory / INI_FILE
    if not ini.exists():
        ini.write_text("[pytest]\naddopts = -ra\n", encoding="utf-8")
    path = directory / f"{name}.py"
    path.write_text(text, encoding="utf-8")
    return path


def run_test(path: Path, *, import_path: str | None, system: str | None = None) -> dict[str, Any]:
    """Run the exported file with pytest in a process of its own; its output is kept beside
    it. ``failed`` is True when a test failed, False when all passed, None when pytest could
    not run it (not installed, the file broken, no time left)."""
    label = "as-exported" if system is None else "against-" + re.sub(r"[^\w.-]+", "-", system)
    output = path.with_name(f"{path.stem}.{label}.txt")
    if importlib.util.find_spec("pytest") is None:
        return {"failed": None, "detail": "not run: pytest is not installed", "output": None}
    env = dict(os.environ)
    if import_path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (import_path, env.get("PYTHONPATH"))))
    env.pop(SYSTEM_VARIABLE, None)
    if system is not None:
        env[SYSTEM_VARIABLE] = system
    command = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        "-c", str(path.parent / INI_FILE), "--rootdir", str(path.parent), str(path),
    ]  # fmt: skip
    try:
        finished = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=PYTEST_SECONDS, check=False
        )
    except subprocess.TimeoutExpired:
        return {"failed": None, "detail": f"pytest ran past {PYTEST_SECONDS} s", "output": None}
    output.write_text(finished.stdout + finished.stderr, encoding="utf-8")
    failed = {0: False, 1: True}.get(finished.returncode)
    last = (finished.stdout.strip().splitlines() or ["(no output)"])[-1]
    detail = last if failed is not None else f"pytest exited {finished.returncode}: {last}"
    return {"failed": failed, "detail": detail, "output": output.name}
