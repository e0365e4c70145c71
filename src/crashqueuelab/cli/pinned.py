"""Running a command again in a pinned release's environment (``lab.environments``).

``--system huey==3.2.1`` makes the command run again, with the same arguments, as
``python -m crashqueuelab ...`` in that release's environment: its stdout (the one JSON
object) gains the environment, and its stderr is passed on line by line as it comes.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.versions.environments import (
    PINNED_VARIABLE,
    Pin,
    ensure_environment,
    parse_pin,
    parse_with,
    pinned_environment,
    python_of,
)
from crashqueuelab.systems.registry import distribution_of, extras_of

#: How long a pinned run may go on after its parent was interrupted (it stops itself).
STOP_GRACE_S = 60.0


def pins_of(systems: Sequence[str], fixed: Sequence[str] = ()) -> list[Pin]:
    """The releases this run must move to an environment of their own (with the
    dependencies ``fixed`` by ``--with`` beside them): none inside one."""
    pins = [pin for pin in (parse_pin(spec, distribution_of, extras_of) for spec in systems) if pin]
    if len(pins) > 1:
        raise InvalidInput("system", "one pinned release per run (run `versions` for more)")
    pin = parse_with(fixed, pins[0] if pins else None)
    return [pin] if pin is not None and os.environ.get(PINNED_VARIABLE) != pin.label else []


def pinned_label(system: str, fixed: Sequence[str]) -> str:
    """The spec a run inside a pinned environment records: the pin and what ``--with``
    fixed beside it (``Pin.label``)."""
    pin = parse_with(fixed, parse_pin(system, distribution_of, extras_of))
    return system if pin is None else pin.label


def _pass_on(stream: Any, err: TextIO, prefix: str) -> None:
    for line in stream:
        # One write a line: runs side by side (``versions --at-once``) share ``err``.
        err.write(prefix + line)
        err.flush()


def run_pinned(
    pin: Pin,
    argv: Sequence[str],
    err: TextIO,
    prefix: str = "",
    extra: Mapping[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    """Build (or reuse) the release's environment and run the command in it (``extra``:
    variables set for it alone): its exit code and its JSON result, with the environment
    named; each line it prints to stderr is passed on with ``prefix`` before it."""
    directory, marker = ensure_environment(pin)
    environment = pinned_environment(pin) | dict(extra or {})
    # The same arguments: the run records and reruns ``name==version``, which resolves
    # there (where that release is the one installed) to the system itself.
    command = [str(python_of(directory)), "-m", "crashqueuelab", *argv]
    with subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    ) as child:
        passing = threading.Thread(target=_pass_on, args=(child.stderr, err, prefix), daemon=True)
        passing.start()
        assert child.stdout is not None
        try:
            output = child.stdout.read()
            code = child.wait()
        except KeyboardInterrupt:
            # The pinned run got the same Ctrl-C and keeps its record: wait for it.
            output = child.stdout.read()
            code = child.wait(timeout=STOP_GRACE_S)
        passing.join(timeout=STOP_GRACE_S)
    try:
        result = json.loads(output)
    except ValueError:
        result = {
            "ok": False,
            "error": {
                "type": "PinnedRunFailed",
                "message": f"the run in {directory} printed no JSON (exit {code})",
            },
        }
    if not isinstance(result, dict):
        result = {"ok": False, "result": result}
    installed = marker["installed"]
    result["environment"] = {
        "pin": pin.label,
        "directory": str(directory),
        "installed": {name: installed.get(name.lower()) for name in pin.distributions},
    }
    return code, result
