"""Telling a broken promise from a documented weakness.

The lab judges every system against its own contract: leases, fenced acknowledgements,
nothing lost after a power cut. A library that never promised one of these is not broken
when it lacks it; it is weaker than the lab's contract, as its documentation says. Each
system declares those weaknesses (``Documented``, with a link to the library's own words);
this module sorts a run's anomalies into the ones a declared weakness explains and the ones
none does. Only the second kind is a bug in the library. A weakness that names kinds of
finding explains a finding by its kind and conditions, never by the words of its line; its
patterns are the fallback for a line that has no finding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any

from crashqueuelab.judges.findings import Anomaly, Fact
from crashqueuelab.systems.contract import Condition, Conditions, Documented, System

#: A crash case's anomaly line starts with this (``campaign.verdict.anomalies_of``).
CASE_LINE = "case "

#: One anomaly of a run: its finding, or its line alone where the run kept none.
Finding = Anomaly | str


def explains(
    weakness: Documented, finding: Finding, crash_mode: str, faults: Sequence[str] = ()
) -> bool:
    """Whether ``weakness`` accounts for one anomaly of a run in ``crash_mode`` in which
    ``faults`` (chaos's fault kinds) were delivered: a finding by its kind and conditions
    where the weakness names kinds, a line without one by the weakness's patterns."""
    line = finding if isinstance(finding, str) else finding.text
    if crash_mode in weakness.crash_modes and line.startswith(CASE_LINE):
        return True
    if any(fault in faults for fault in weakness.faults) and _struck(finding):
        return True
    if isinstance(finding, Anomaly) and weakness.names_kinds:
        return all(_named(weakness, part) for part in finding.leaves())
    return any(fnmatchcase(line, pattern) for pattern in weakness.explains)


def _struck(finding: Finding) -> bool:
    """Whether a fault of the run could have touched the finding's job: a deploy run with
    server restarts says so per job (``before_server_restart``: the job was in the store
    when a restart began); elsewhere every finding of the run could have been."""
    return not isinstance(finding, Anomaly) or finding.value("before_server_restart") is not False


def _named(weakness: Documented, finding: Anomaly) -> bool:
    alternatives = weakness.alternatives(finding.kind.value)
    return alternatives is not None and any(
        all(_meets(finding.value(name), wanted) for name, wanted in conditions.items())
        for conditions in alternatives
    )


def _meets(value: Fact | None, wanted: Condition) -> bool:
    """Whether a finding's field or fact ``value`` is one ``wanted`` allows (a string as an
    ``fnmatch`` pattern; a bool is never a number, nor a number a bool)."""
    if value is None:
        return False
    for one in wanted if isinstance(wanted, tuple) else (wanted,):
        if isinstance(one, str):
            if isinstance(value, str) and fnmatchcase(value, one):
                return True
        elif type(one) is type(value) and one == value:
            return True
    return False


def explained_by(
    weaknesses: Sequence[Documented],
    finding: Finding,
    crash_mode: str,
    faults: Sequence[str] = (),
) -> int | None:
    """The position of the first of ``weaknesses`` that accounts for ``finding``; None when
    none does (it is a broken promise)."""
    return next(
        (
            position
            for position, weakness in enumerate(weaknesses)
            if explains(weakness, finding, crash_mode, faults)
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
            kinds=tuple(entry.get("kinds", ())),
            when={
                kind: _restored(conditions)
                for kind, conditions in (entry.get("when") or {}).items()
            },
        )
        for entry in (promises or {}).get("declared", [])
    ]


def _restored(conditions: Any) -> Conditions | tuple[Conditions, ...]:
    """Conditions as ``Documented.to_json`` wrote them (lists for tuples)."""

    def one(kept: Mapping[str, Any]) -> Conditions:
        return {
            name: tuple(value) if isinstance(value, list) else value for name, value in kept.items()
        }

    if isinstance(conditions, list):
        return tuple(one(kept) for kept in conditions)
    return one(conditions)


def classify(
    system: System, crash_mode: str, anomalies: Sequence[Finding], faults: Sequence[str] = ()
) -> dict[str, Any]:
    """The run's verdict against the system's own promises: every anomaly (its finding, or
    its line where it has none) either under the first declared weakness that explains it,
    or among the broken promises (their lines). ``faults``: the kinds of chaos's faults the
    run delivered."""
    documented: list[dict[str, Any]] = [
        {**weakness.to_json(), "lines": 0, "first": None} for weakness in system.documented
    ]
    broken = []
    for finding in anomalies:
        line = finding if isinstance(finding, str) else finding.text
        index = explained_by(system.documented, finding, crash_mode, faults)
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
