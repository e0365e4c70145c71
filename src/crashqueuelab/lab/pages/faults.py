"""How a chaos page draws each fault it delivered: its colour, whether it is shaded for as
long as it held or drawn as a line at its instant, and the title a reader hovers over.
Network faults take their colours and titles from ``network``."""

from __future__ import annotations

from typing import Any

from crashqueuelab.lab.pages.network import NETWORK_COLORS, WINDOWED, network_title

#: Faults shaded for as long as they held (the others are lines at their instant).
SHADED = ("SIGSTOP", *WINDOWED)
KILL, PAUSE, POWER_CUT = "#d93025", "#f29900", "#5f2eea"
SERVER_RESTART, SESSION_KILL = "#202124", "#00897b"
FAULT_COLORS = {
    "SIGKILL": KILL,
    "SIGSTOP": PAUSE,
    "power cut": POWER_CUT,
    "server restart": SERVER_RESTART,
    "session terminated": SESSION_KILL,
    **NETWORK_COLORS,
}


def fault_title(fault: dict[str, Any], digits: int = 2) -> str:
    if fault["kind"] == "power cut":
        fate = fault["fate"]
        return (
            f"power cut at {fault['at_s']:.{digits}f} s: every process died; of"
            f" {fault['pending_writes']} unsynced writes and"
            f" {fault['pending_directory_changes']} unsynced directory changes the disk kept"
            f" {fate.get('kept', 0)} and tore {fate.get('torn', 0)} (crash state"
            f" {fault['crash_state']})"
        )
    if fault["kind"] == "server restart":
        return (
            f"server crashed (pg_ctl stop -m immediate) at {fault['at_s']:.{digits}f} s,"
            f" accepting connections again {fault['back_after_s']:.{digits}f} s later"
        )
    if fault["kind"] in NETWORK_COLORS:
        return network_title(fault, digits)
    return f"{fault['kind']} {fault['worker_id']} at {fault['at_s']:.{digits}f} s"
