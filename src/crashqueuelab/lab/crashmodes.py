"""The two ways the lab crashes a system: a process death, which keeps the operating
system's page cache, or a power cut, which loses every write nobody synced."""

from __future__ import annotations

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.powerloss.disk import MODE, require_power_loss

PROCESS = "process"
POWER_LOSS = MODE
CRASH_MODES = (PROCESS, POWER_LOSS)


def check_crash_mode(mode: str) -> None:
    """Refuse an unknown mode; for power loss, a machine that cannot provide it (exit 4)."""
    if mode not in CRASH_MODES:
        raise InvalidInput("crash_mode", f"{mode!r} is not one of {', '.join(CRASH_MODES)}")
    if mode == POWER_LOSS:
        require_power_loss()
