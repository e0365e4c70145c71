"""The ways the lab crashes a system, by the names a run's record gives them: a process
death, which keeps the operating system's page cache, or a power cut, which loses every
write nobody synced (``lab.faults.crashmodes`` checks that this machine can make one); and,
for a campaign on a PostgreSQL system, a failover: the process death, then the primary's
machine dies and its standby is promoted."""

from __future__ import annotations

PROCESS = "process"
POWER_LOSS = "power-loss"
FAILOVER = "failover"
CRASH_MODES = (PROCESS, POWER_LOSS)
#: A campaign's modes: chaos takes failovers as a fault of their own (``--failovers``).
CAMPAIGN_CRASH_MODES = (*CRASH_MODES, FAILOVER)
