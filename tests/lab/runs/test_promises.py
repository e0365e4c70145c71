"""Sorting a run's anomalies into broken promises and documented weaknesses."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.judges.findings import Anomaly, Kind, joined
from crashqueuelab.judges.observations import judge_observations
from crashqueuelab.lab.runs.promises import classify, declared
from crashqueuelab.systems import resolve_system
from crashqueuelab.systems.contract import Documented


def test_a_line_no_declared_weakness_explains_is_a_broken_promise() -> None:
    system = replace(
        resolve_system("sqlite"),
        documented=(
            Documented("no fencing", "https://example.org/docs", explains=("probe fence: *",)),
            Documented("not synced", "https://example.org/sync", crash_modes=("power-loss",)),
        ),
    )
    lines = ["probe fence: accepted", "case 01-x: lost", "model workload: job lost"]
    process = classify(system, "process", lines)
    assert process["broken_promises"] == ["case 01-x: lost", "model workload: job lost"]
    assert process["keeps_its_promises"] is False
    assert "breaks its own promise: case 01-x: lost (and 1 more)" in process["verdict"]
    power = classify(system, "power-loss", lines)
    assert power["broken_promises"] == ["model workload: job lost"]
    assert [entry["lines"] for entry in power["weaker_as_documented"]] == [1, 1]
    clean = classify(system, "process", [])
    assert clean["verdict"].endswith("keeps its promises and the lab's contract")


def test_a_weakness_against_a_fault_explains_the_lines_of_runs_that_delivered_it() -> None:
    system = replace(
        resolve_system("sqlite"),
        documented=(
            Documented("late acks", "https://example.org/a", explains=("job *: late*",)),
            Documented("no snapshot", "https://example.org/b", faults=("server restart",)),
        ),
    )
    lines = ["job a: late acknowledgement accepted", "job b: missing from the store (lost)"]
    without = classify(system, "process", lines, ["SIGKILL"])
    assert without["broken_promises"] == ["job b: missing from the store (lost)"]
    restarted = classify(system, "process", lines, ["SIGKILL", "server restart"])
    assert restarted["broken_promises"] == []
    # The first weakness that explains a line takes it.
    assert [entry["lines"] for entry in restarted["weaker_as_documented"]] == [1, 1]


def _beyond_the_limit_after(directory: Path, *endings: str | None) -> list[Anomaly]:
    """The model workload's findings when a job is handed out once more than it has attempts
    (one per ending), after earlier attempts ended as ``endings`` say: ``"retry"`` (a failure
    answered retry), or None (nothing: the lease expired)."""
    limit = len(endings)
    lines: list[dict[str, object]] = [
        {"op": "submit", "t": 0, "key": "k", "job_id": "j1", "max_attempts": limit}
    ]
    for attempt, ending in enumerate([*endings, None], 1):
        t = attempt * 100
        lines.append({"op": "claim", "t": t, "key": "k", "worker": f"w{attempt}",
                      "token": f"t{attempt}", "attempt": attempt, "deadline": t + 10,
                      "batch": False})  # fmt: skip
        if ending is not None:
            lines.append({"op": "fail", "t": t + 5, "key": "k", "worker": f"w{attempt}",
                          "token": f"t{attempt}", "verdict": ending})  # fmt: skip
    directory.mkdir()
    log = directory / "observations.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    verdict = judge_observations(log, {"k": "leased"})
    return [finding.within("model workload: ") for finding in verdict.findings]


#: What pgqueuer 1.x documents: its attempts count the retries a handler asks for, never a
#: hand-out after its heartbeat timeout.
UNCOUNTED = Documented(
    "a job the heartbeat timeout hands out again is not counted",
    "https://example.org/retries",
    when={Kind.ATTEMPT_BEYOND_LIMIT: {"past_the_limit_by_unreported_attempts": True}},
)


def test_a_hand_out_beyond_the_limit_is_documented_only_after_the_cause_the_library_names(
    tmp_path: Path,
) -> None:
    # The case: "handed out as attempt 2 of 1" is a harmless uncounted expiry on a
    # library that documents expiries as uncounted, and a bug after a failure on any.
    [expired] = _beyond_the_limit_after(tmp_path / "expired", None)
    [failed] = _beyond_the_limit_after(tmp_path / "failed", "retry")
    line = "model workload: job k: handed out as attempt 2 of 1 (at 0.0002 s)"
    assert expired.text == failed.text == line  # the same words on the page
    assert (expired.kind, expired.job, expired.attempt, expired.limit) == (
        Kind.ATTEMPT_BEYOND_LIMIT,
        "k",
        2,
        1,
    )
    assert (expired.facts["previous_attempt"], failed.facts["previous_attempt"]) == (
        "expired",
        "failed",
    )
    system = replace(resolve_system("sqlite"), documented=(UNCOUNTED,))
    assert classify(system, "process", [expired])["keeps_its_promises"] is True
    assert classify(system, "process", [failed])["broken_promises"] == [line]
    # An expiry, then a failure the library counted: one counted attempt of two, so the
    # third hand-out is the uncounted expiry's, whatever the last attempt did.
    [mixed] = _beyond_the_limit_after(tmp_path / "mixed", None, "retry")
    assert (
        mixed.facts["previous_attempt"],
        mixed.facts["past_the_limit_by_unreported_attempts"],
    ) == (
        "failed",
        True,
    )
    assert classify(system, "process", [mixed])["keeps_its_promises"] is True
    # The library's own words as a condition on the last attempt's end, as data.
    previous = replace(UNCOUNTED, when={"attempt_beyond_limit": {"previous_attempt": "expired"}})
    by_the_last = replace(system, documented=(previous,))
    assert classify(by_the_last, "process", [expired, failed])["broken_promises"] == [line]
    # A run kept before findings existed is judged by its line, as it was.
    as_a_pattern = replace(UNCOUNTED, when={}, explains=("model workload: job *: handed out *",))
    patterned = replace(system, documented=(as_a_pattern,))
    assert classify(patterned, "process", [line])["keeps_its_promises"] is True


def test_a_broad_pattern_cannot_hide_a_finding_of_a_kind_its_weakness_does_not_name(
    tmp_path: Path,
) -> None:
    [expired] = _beyond_the_limit_after(tmp_path / "expired", None)
    no_token = Documented(
        "no token: a late acknowledgement is taken",
        "https://example.org/tokens",
        kinds=("late_acknowledgement_accepted",),
        explains=("model workload: *",),  # an author's first, too broad, pattern
    )
    system = replace(resolve_system("sqlite"), documented=(no_token,))
    assert classify(system, "process", [expired])["broken_promises"] == [expired.text]
    # The same pattern still explains a line that has no finding (its fallback).
    assert classify(system, "process", [expired.text])["keeps_its_promises"] is True
    # A weakness that names no kind is matched by its patterns, as every weakness was.
    patterns_only = replace(system, documented=(replace(no_token, kinds=()),))
    assert classify(patterns_only, "process", [expired])["keeps_its_promises"] is True


def test_a_weakness_naming_a_kind_that_does_not_exist_is_refused_at_once() -> None:
    with pytest.raises(InvalidInput, match="handed_out_twice: no such kind of finding"):
        Documented("x", "https://example.org", kinds=("handed_out_twice",))


def _finding(kind: Kind, **facts: str | int | bool) -> Anomaly:
    return Anomaly(kind, f"{kind.value}: {facts}", job="k", attempt=2, point="p", facts=facts)


def test_a_condition_is_a_value_a_tuple_of_values_or_a_pattern_and_a_missing_fact_meets_none() -> (
    None
):
    exited = Documented(
        "a worker stops when its connection breaks",
        "https://example.org/connections",
        when={
            Kind.WORKER_EXITED: (
                {"status": 3, "error": ("*connection is lost*", "*server closed*")},
                {"status": 4, "restarted": True},
            )
        },
    )
    system = replace(resolve_system("sqlite"), documented=(exited,))

    def kept(finding: Anomaly) -> bool:
        return bool(classify(system, "process", [finding])["keeps_its_promises"])

    assert kept(_finding(Kind.WORKER_EXITED, status=3, error="boom: the connection is lost"))
    assert kept(_finding(Kind.WORKER_EXITED, status=4, restarted=True))
    # Another error, another status, a number for a bool, a missing fact: none is it.
    assert not kept(_finding(Kind.WORKER_EXITED, status=3, error="disk full"))
    assert not kept(_finding(Kind.WORKER_EXITED, status=1, error="the connection is lost"))
    assert not kept(_finding(Kind.WORKER_EXITED, status=4, restarted=1))
    assert not kept(_finding(Kind.WORKER_EXITED, status=3))
    assert not kept(_finding(Kind.LOST, status=3, error="the connection is lost"))
    # The fields are conditions too: the job, the attempt, the point.
    by_field = replace(exited, when={Kind.LOST: {"job": "k", "attempt": 2, "point": "p*"}})
    assert classify(replace(system, documented=(by_field,)), "process", [_finding(Kind.LOST)])[
        "keeps_its_promises"
    ]


def test_a_line_of_several_reasons_is_explained_only_when_each_of_them_is() -> None:
    unfinished = _finding(Kind.RECOVERY_UNFINISHED, effect_state="dequeued")
    effects = _finding(Kind.EFFECTS_NOT_ONCE, effect_effects=0)
    undone = _finding(Kind.FINISHED_JOB_UNDONE, state="pending")
    held = Documented(
        "a dead worker's job is held until a TTL",
        "https://example.org/ttl",
        kinds=(Kind.EFFECTS_NOT_ONCE,),
        when={Kind.RECOVERY_UNFINISHED: {"effect_state": "dequeued"}},
    )
    system = replace(resolve_system("sqlite"), documented=(held,))
    both = joined("case 01-x: ", [effects, unfinished])
    assert classify(system, "process", [both])["keeps_its_promises"] is True
    with_a_bug = joined("case 01-x: ", [effects, undone, unfinished])
    assert classify(system, "process", [with_a_bug])["broken_promises"] == [with_a_bug.text]


def test_a_retained_run_is_judged_again_by_the_kinds_and_conditions_it_declared() -> None:
    system = replace(resolve_system("sqlite"), documented=(UNCOUNTED,))
    declared_now = classify(system, "process", [])
    [again] = declared(declared_now)
    assert again == UNCOUNTED
    several = replace(
        UNCOUNTED, kinds=("lost",), when={"unfinished": ({"state": ("a", "b")}, {"poison": True})}
    )
    [kept] = declared({"declared": [several.to_json()]})
    assert kept == several
    # A record kept before kinds existed declares patterns alone.
    old = {k: v for k, v in several.to_json().items() if k not in ("kinds", "when")}
    [patterns_only] = declared({"declared": [old]})
    assert (patterns_only.kinds, dict(patterns_only.when)) == ((), {})
