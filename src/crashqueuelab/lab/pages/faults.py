"""How a chaos page draws each fault it delivered: its colour, whether it is shaded for as
long as it held or drawn as a line at its instant, and the title a reader hovers over.
Network faults take their colours and titles from ``network``. A deploy is drawn on the
lane of each worker it stopped: the SIGTERM, the grace window, and the SIGKILL at its end
or the worker's own exit within it (``deploy_marks``)."""

from __future__ import annotations

from typing import Any

from crashqueuelab.lab.pages.network import NETWORK_COLORS, WINDOWED, network_title

#: Faults shaded for as long as they held (the others are lines at their instant).
SHADED = ("SIGSTOP", *WINDOWED)
KILL, PAUSE, POWER_CUT = "#d93025", "#f29900", "#5f2eea"
SERVER_RESTART, SESSION_KILL, FAILOVER = "#202124", "#00897b", "#1a73e8"
HELD_COMMITS = "#0b8043"
#: A deploy's SIGTERM, its grace window, the SIGKILL at the grace's end, a worker's exit.
SIGTERM, GRACE, GRACE_KILL, EXIT = "#a142f4", "#fde293", "#202124", "#5f6368"
FAULT_COLORS = {
    "SIGKILL": KILL,
    "SIGSTOP": PAUSE,
    "power cut": POWER_CUT,
    "server restart": SERVER_RESTART,
    "failover": FAILOVER,
    "commits held open": HELD_COMMITS,
    "session terminated": SESSION_KILL,
    "deploy": SIGTERM,
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
    if fault["kind"] == "failover":
        measured = fault["failover"]
        return (
            f"failover at {fault['at_s']:.{digits}f} s: the primary killed"
            f" {measured['before'].get('lag_bytes')} bytes ahead of its standby, the standby"
            f" promoted {measured['promoted_s']:.{digits}f} s later, a new standby streaming"
            f" after {measured['new_standby_streaming_s']:.{digits}f} s"
        )
    if fault["kind"] == "commits held open":
        held = fault["held_commits"]
        return (
            f"commits held open at {fault['at_s']:.{digits}f} s: the standby stopped answering,"
            f" every client connection was reset with {held['commits_waiting_at_the_reset']}"
            f" COMMITs waiting for it, {held['commits_still_waiting_before_the_standby_came_back']}"
            f" waiting when it came back {held['held_s']:.{digits}f} s later"
        )
    if fault["kind"] in NETWORK_COLORS:
        return network_title(fault, digits)
    if fault["kind"] == "deploy":
        stopped = fault["workers"]
        killed = sum(1 for worker in stopped if worker.get("killed_at_s") is not None)
        return (
            f"deploy at {fault['at_s']:.{digits}f} s: SIGTERM to"
            f" {', '.join(worker['worker_id'] for worker in stopped)}, grace"
            f" {fault['grace_s']:g} s; {len(stopped) - killed} exited within it,"
            f" {killed} SIGKILLed at its end"
        )
    return f"{fault['kind']} {fault['worker_id']} at {fault['at_s']:.{digits}f} s"


def deploy_marks(
    fault: dict[str, Any], slot: int, end: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The dots and the windows a deploy draws on slot ``slot``'s lane: each worker of the
    slot it stopped gets its SIGTERM, its grace window (to its exit or its SIGKILL) and the
    SIGKILL or its exit; ``end`` closes a window the run never saw end."""
    dots: list[dict[str, Any]] = []
    windows: list[dict[str, Any]] = []
    for worker in fault["workers"]:
        if worker["worker_slot"] != slot:
            continue
        name, term = worker["worker_id"], worker["sigterm_at_s"]
        killed, exited = worker.get("killed_at_s"), worker.get("exited_at_s")
        over = killed if killed is not None else exited
        said = f"SIGTERM {name} at {term:.3f} s (deploy {fault['index']})"
        dots.append({"at": term, "color": SIGTERM, "r": 5, "kind": "SIGTERM", "title": said})
        windows.append(
            {
                "start": term,
                "end": end if over is None else over,
                "color": GRACE,
                "title": f"{name}'s grace from {term:.3f} s to {worker['grace_end_s']:.3f} s",
            }
        )
        if killed is not None:
            held = worker.get("fates") or {}
            fates = "; ".join(f"{key}: {fate}" for key, fate in sorted(held.items()))
            said = (
                f"SIGKILL of {name}'s session at {killed:.3f} s, the end of its grace, holding"
                f" {len(held)} jobs" + (f" ({fates})" if fates else "")
            )
            dots.append(
                {"at": killed, "color": GRACE_KILL, "r": 5, "kind": "grace SIGKILL", "title": said}
            )
        elif exited is not None:
            dots.append({"at": exited, "color": EXIT, "r": 3, "kind": "exit",
                         "title": f"{name} exited within its grace ({worker.get('exit_code')})"
                         f" by {exited:.3f} s"})  # fmt: skip
    return dots, windows
