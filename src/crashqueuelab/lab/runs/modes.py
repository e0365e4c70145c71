"""The two ways the lab crashes a system, by the names a run's record gives them: a process
death, which keeps the operating system's page cache, or a power cut, which loses every
write nobody synced (``lab.faults.crashmodes`` checks that this machine can make one)."""

from __future__ import annotations

PROCESS = "process"
POWER_LOSS = "power-loss"
CRASH_MODES = (PROCESS, POWER_LOSS)
