"""How a chaos page shows network faults: stalls, partitions and lost-reply windows
shaded for as long as they held, connection resets as lines, and what each proxy path saw."""

from __future__ import annotations

from typing import Any

#: Each network fault's colour on the charts and lanes.
NETWORK_COLORS = {
    "stall": "#c0ca33",
    "partition": "#6d4c41",
    "lost replies": "#c2185b",
    "connection reset": "#455a64",
}
#: Network faults that last a window (the others are instants).
WINDOWED = ("stall", "partition", "lost replies")
#: What each window's shading means, in a chart's legend.
WINDOW_LEGENDS = {
    "stall": "a stalled connection (bytes held, nothing closed)",
    "partition": "the server cut off from every process",
    "lost replies": "a worker's answers dropped, then its connection reset",
}
_WHAT = {
    "stall": "stalled {who} (bytes held both ways, nothing closed)",
    "partition": "cut the server off from every process, both ways",
    "lost replies": "dropped the server's answers to {who}, then reset its connection",
    "connection reset": "reset {who}'s connections",
}


def network_title(fault: dict[str, Any], digits: int = 2) -> str:
    """One network fault in words, with its window."""
    what = _WHAT[fault["kind"]].format(who=fault.get("worker_id", "a worker"))
    if fault["kind"] == "partition" and "worker_id" in fault:
        what = f"cut {', '.join(fault['paths'])} off from the server, both ways"
    if "until_s" in fault:
        return f"{what} from {fault['at_s']:.{digits}f} s to {fault['until_s']:.{digits}f} s"
    return f"{what} at {fault['at_s']:.{digits}f} s"


def legend(report: dict[str, Any]) -> str:
    """The chart title's words for the network faults delivered (empty when none)."""
    delivered = report.get("network_faults_delivered") or {}
    words = {
        "stall": "stalls shaded (lime)",
        "partition": "partitions shaded (brown)",
        "lost replies": "lost replies shaded (magenta)",
        "connection reset": "connection resets (slate)",
    }
    return "".join(f", {words[kind]}" for kind, count in delivered.items() if count)


def network_rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The figures of a run with a fault proxy: faults delivered, and what the paths saw."""
    network = report.get("network")
    if not network:
        return []
    delivered = report.get("network_faults_delivered", {})
    plan = network["plan"]
    counts: dict[str, int] = {}
    for path in network["paths"].values():
        for name, count in path.items():
            counts[name] = counts.get(name, 0) + count
    return [
        (
            "stalls / partitions / lost-reply windows / connection resets",
            " / ".join(
                str(delivered.get(kind, 0))
                for kind in ("stall", "partition", "lost replies", "connection reset")
            ),
            f"each window {plan['window_ms']:g} ms; every process reached the server through"
            " a proxy on 127.0.0.1"
            + (f" with {plan['latency_ms']:g} ms added each way" if plan["latency_ms"] else "")
            + (
                f", at most {plan['bandwidth_bytes_s']:,.0f} bytes/s each way"
                if plan.get("bandwidth_bytes_s")
                else ""
            )
            + (
                f"; a partition cut off {plan['partition_workers']} worker(s), the maintenance"
                " process spared"
                if plan.get("partition_workers")
                else ""
            ),
        ),
        (
            "connections through the proxy",
            f"{counts.get('connections', 0):,}",
            f"{counts.get('lost_replies', 0):,} lost an answer and were reset after their"
            f" window, {counts.get('reset', 0):,} reset by a fault,"
            f" {counts.get('refused', 0):,} found the server down",
        ),
    ]
