"""The lab's errors: something a run needs is not here (a system, an operation a system
lacks, a crash mode this machine cannot make, a server that cannot start)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from crashqueuelab.core.errors.queue import CrashQueueLabError

#: The checkout this package runs from, when it runs from one (an editable install).
_CHECKOUT = Path(__file__).resolve().parents[4]


def install_hint(extra: str, *, checkout: Path = _CHECKOUT, prefix: str = sys.prefix) -> str:
    """How to install one of the lab's extras, in the words the README uses: from a checkout
    (an editable install, as the quick start makes), its environment's pip with ``-e``;
    otherwise pip with the package's name."""
    if not (checkout / "pyproject.toml").is_file():
        return f"pip install 'crashqueuelab[{extra}]'"
    pip = Path(prefix) / "bin" / "pip"
    shown = os.path.relpath(pip, checkout) if pip.is_relative_to(checkout) else str(pip)
    return f"{shown} install -e '.[{extra}]' (from the checkout's root)"


class SystemUnavailable(CrashQueueLabError):
    """Raised when a system under test cannot be found or its factory gives no system."""

    kind = "SystemUnavailable"

    def __init__(self, spec: str, reason: str) -> None:
        super().__init__(f"system {spec!r}: {reason}")
        self.spec = spec
        self.reason = reason


class OperationUnsupported(CrashQueueLabError):
    """Raised when a system is asked for an operation its capabilities say it does not have."""

    kind = "OperationUnsupported"

    def __init__(self, system: str, operation: str) -> None:
        super().__init__(f"{system} has no {operation}")
        self.system = system
        self.operation = operation


class CrashModeUnavailable(CrashQueueLabError):
    """Raised when this machine cannot provide a crash mode (power loss needs Linux FUSE)."""

    kind = "CrashModeUnavailable"

    def __init__(self, mode: str, reason: str) -> None:
        super().__init__(f"crash mode {mode!r}: {reason}")
        self.mode = mode
        self.reason = reason


class ServerUnavailable(CrashQueueLabError):
    """Raised when a system's server cannot be started here (no binaries, no account)."""

    kind = "ServerUnavailable"

    def __init__(self, reason: str, server: str = "postgres") -> None:
        super().__init__(f"{server} server: {reason}")
        self.reason = reason
