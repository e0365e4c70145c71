"""Telling a broken promise from a documented weakness.

The lab judges every system against its own contract: leases, fenced acknowledgements,
nothing lost after a power cut. A library that never promised one of these is not broken
when it lacks it; it is weaker than the lab's contract, as its documentation says. Each
system declares those weaknesses (``Documented``, with a link to the library's own words);
this module sorts a run's anomaly lines into the ones a declared weakness explains and the
ones none does. Only the second kind is a bug in the library.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any

from crashqueuelab.systems.contract import Documented, System

#: A crash case's anomaly line starts with this (``campaign.anomalies_of``).
CASE_LINE = "case "


def explains(weakness: Documented, line: str, crash_mode: str, faults: Sequence[str] = ()) -> bool:
    """Whether ``weakness`` accounts for one anomaly line of a run in ``crash_mode`` in which
    ``faults`` (chaos's fault kinds) were delivered."""
    if crash_mode in weakness.crash_modes and line.startswith(CASE_LINE):
        return True
    if any(fault in faults for fault in weakness.faults):
        return True
    return any(fnmatchcase(line, pattern) for pattern in weakness.explains)


def explained_by(
    weaknesses: Sequence[Documented], line: str, crash_mode: str, faults: Sequence[str] = ()
) -> int | None:
    """The position of the first of ``weaknesses`` that accounts for ``line``; None when
    none does (the line is a broken promise)."""
    return next(
        (
            position
            for position, weakness in enumerate(weaknesses)
            if explains(weakness, line, crash_mode, faults)
        ),
        None,
    )


def declared(promises: Mapping[str, Any] | None) -> list[Documented]:
    """The weaknesses a run's record says its system declares (``classify``'s
    ``declared``), as the system declared them: a retained run is judged again without
    building its system."""
    return [
        Documented(
            what=entry["what"],
            source=entry["source"],
            points=tuple(entry["points"]),
            crash_modes=tuple(entry["crash_modes"]),
            explains=tuple(entry["explains"]),
            faults=tuple(entry["faults"]),
        )
        for entry in (promises or {}).get("declared", [])
    ]


def classify(
    system: System, crash_mode: str, anomalies: Sequence[str], faults: Sequence[str] = ()
) -> dict[str, Any]:
    """The run's verdict against the system's own promises: every anomaly line either under
    the first declared weakness that explains it, or among the broken promises. ``faults``:
    the kinds of chaos's faults the run delivered."""
    documented: list[dict[str, Any]] = [
        {**weakness.to_json(), "lines": 0, "first": None} for weakness in system.documented
    ]
    broken = []
    for line in anomalies:
        index = explained_by(system.documented, line, crash_mode, faults)
        if index is None:
            broken.append(line)
            continue
        entry = documented[index]
        entry["lines"] += 1
        entry["first"] = entry["first"] or line
    shown = [entry for entry in documented if entry["lines"]]
    return {
        "keeps_its_promises": not broken,
        "broken_promises": broken,
        "weaker_as_documented": shown,
        "declared": [weakness.to_json() for weakness in system.documented],
        "verdict": verdict_line(system, broken, shown),
    }


def verdict_line(system: System, broken: Sequence[str], weaker: Sequence[dict[str, Any]]) -> str:
    """``library X, version V: ...`` in the words a user reads first."""
    if broken:
        more = f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""
        return f"{system.version}: breaks its own promise: {broken[0]}{more}"
    if weaker:
        ways = "; ".join(entry["what"] for entry in weaker)
        return (
            f"{system.version}: keeps its promises;"
            f" weaker than the lab's contract, as documented: {ways}"
        )
    return f"{system.version}: keeps its promises and the lab's contract"
