"""The failover judge on hand-made artifacts: each kind of finding, where it is counted, and
the verdict against each level's promise."""

from __future__ import annotations

from typing import Any

import pytest

from crashqueuelab.lab.failover.judge import judge_failovers
from crashqueuelab.lab.failover.promises import promise_of

KEYS = ["a", "b", "c", "d"]


def _event(at_s: float, event: str, key: str, attempt: int | None = None) -> dict[str, Any]:
    return {"at_s": at_s, "event": event, "key": key} | (
        {} if attempt is None else {"attempt": attempt}
    )


def _events() -> list[dict[str, Any]]:
    return [
        _event(0.1, "enqueued", "a"),
        _event(0.2, "executed", "a", 1),
        _event(0.3, "completed", "a", 1),
        _event(1.0, "enqueued", "b"),  # in the lag: lost with its completion
        _event(1.1, "executed", "b", 1),
        _event(1.2, "completed", "b", 1),
        _event(0.4, "enqueued", "c"),
        _event(1.3, "executed", "c", 1),
        _event(1.4, "completed", "c", 1),  # lost: its lease comes back, it runs again
        _event(3.0, "executed", "c", 2),
        _event(3.1, "completed", "c", 2),
        _event(0.5, "enqueued", "d"),
        _event(0.6, "call-failed", "d"),
        {"at_s": 0.7, "event": "call-failed", "key": None},
    ]


FAILOVERS = [{"killed_at_s": 2.0, "snapshot": {"a": ["succeeded", 1], "c": ["leased", 1]}}]
FINAL = {"a": ["succeeded", 1], "c": ["succeeded", 2], "d": ["pending", 0]}


def test_each_kind_of_finding_is_found_once_and_attributed_to_its_failover() -> None:
    found = judge_failovers(
        level="local", keys=KEYS, events=_events(), failovers=FAILOVERS, final=FINAL
    )
    assert found["lost_enqueues"] == [{"key": "b", "acknowledged_at_s": 1.0, "failover": 0}]
    # b's acknowledged completion went with its enqueue: counted there, not twice.
    assert [item["key"] for item in found["resurrected_completions"]] == ["c"]
    assert found["resurrected_completions"][0]["executed_again_at_s"] == 3.0
    assert found["leases_came_back"] == [{"key": "c", "attempt": 1, "failover": 0}]
    assert found["duplicate_effects"] == [{"key": "c", "executions": 2, "acknowledged_at_s": 1.4}]
    assert found["counts"] == {
        "lost_enqueues": 1,
        "resurrected_completions": 1,
        "leases_came_back": 1,
        "duplicate_effects": 1,
        "visible_then_lost": 0,
        "jobs_affected": 2,
    }
    assert found["enqueues_acknowledged"] == 4
    assert found["completions_acknowledged"] == 3
    assert found["executions"] == 4


@pytest.mark.parametrize(
    ("level", "allowed"),
    [
        ("off", True),
        ("local", True),
        ("remote_write", False),
        ("on", False),
        ("remote_apply", False),
    ],
)
def test_a_finding_is_documented_only_where_the_level_allows_a_loss(
    level: str, allowed: bool
) -> None:
    found = judge_failovers(
        level=level, keys=KEYS, events=_events(), failovers=FAILOVERS, final=FINAL
    )
    assert found["promise"]["allows_loss"] is allowed
    assert found["contract_held"] is False
    assert found["ok"] is allowed
    assert (found["documented"], found["broken_promises"]) == ((4, 0) if allowed else (0, 4))


def test_nothing_lost_holds_the_contract_at_every_level() -> None:
    events = [e for e in _events() if e["key"] in ("a", "d")]
    found = judge_failovers(
        level="on", keys=["a", "d"], events=events, failovers=FAILOVERS, final=FINAL
    )
    assert found["contract_held"]
    assert found["ok"]
    assert found["counts"]["jobs_affected"] == 0


def test_a_completion_never_followed_by_success_is_resurrected_even_without_a_rerun() -> None:
    events = [_event(0.1, "enqueued", "a"), _event(0.2, "completed", "a", 1)]
    found = judge_failovers(
        level="on", keys=["a"], events=events, failovers=[], final={"a": ["pending", 0]}
    )
    assert found["resurrected_completions"][0]["final_state"] == "pending"
    assert found["resurrected_completions"][0]["failover"] is None
    assert found["broken_promises"] == 1


def test_what_a_restarted_primary_showed_and_the_promoted_standby_lacks_is_listed_apart() -> None:
    failovers = [
        {
            "killed_at_s": 2.0,
            "restarted_primary_showed": {"a": ["succeeded", 1], "b": ["pending", 0]},
            "snapshot": {"a": ["leased", 1]},
        },
        {"killed_at_s": 4.0, "snapshot": {}},
    ]
    events = [_event(0.1, "enqueued", "a")]
    found = judge_failovers(
        level="on",
        keys=["a", "b"],
        events=events,
        failovers=failovers,
        final={"a": ["succeeded", 1], "b": ["succeeded", 1]},
    )
    assert found["visible_then_lost"] == [
        {
            "key": "a",
            "failover": 0,
            "restarted_primary_showed": ["succeeded", 1],
            "promoted_standby_has": ["leased", 1],
            "acknowledged_enqueue": True,
        },
        {
            "key": "b",
            "failover": 0,
            "restarted_primary_showed": ["pending", 0],
            "promoted_standby_has": None,
            "acknowledged_enqueue": False,
        },
    ]
    # Not a finding against the queue: it acknowledged neither.
    assert found["ok"]
    assert found["contract_held"]


def test_every_level_quotes_its_documentation() -> None:
    for level in ("off", "local", "remote_write", "on", "remote_apply"):
        promise = promise_of(level)
        assert promise["source"].startswith("https://www.postgresql.org/docs/15/")
        assert promise["quoted"]
    assert "marked fully committed" in promise_of("on")["waiting_commits"]


def test_an_answer_written_down_after_the_kill_and_before_the_promotion_is_that_failovers() -> None:
    events = [_event(2.1, "enqueued", "a")]
    failovers = [{"killed_at_s": 2.0, "promoted_at_s": 3.0}, {"killed_at_s": 5.0}]
    found = judge_failovers(level="local", keys=["a"], events=events, failovers=failovers, final={})
    assert found["lost_enqueues"][0]["failover"] == 0


def test_two_standbys_make_a_loss_documented_only_when_the_lagging_one_is_promoted() -> None:
    events = [_event(1.0, "enqueued", "a")]
    failovers = [{"killed_at_s": 2.0, "promoted_at_s": 2.2}]

    def judged(standbys: int, promote: str) -> dict[str, Any]:
        return judge_failovers(
            level="on", keys=["a"], events=events, failovers=failovers, final={},
            standbys=standbys, promote=promote,
        )  # fmt: skip

    lagging = judged(2, "lagging")
    assert lagging["counts"]["lost_enqueues"] == 1
    assert (lagging["documented"], lagging["broken_promises"]) == (1, 0)
    assert "ANY 1 (*)" in lagging["promise"]["setting"]
    assert "waited for the other standby" in lagging["promise"]["why_allowed"]
    assert "num_sync" in lagging["promise"]["quorum"]
    # Promoting the standby that received the most keeps the promise: a loss breaks it.
    advanced = judged(2, "most-advanced")
    assert (advanced["documented"], advanced["broken_promises"]) == (0, 1)
    assert "why_allowed" not in advanced["promise"]
    # A level that never waits allows the loss whichever standby is promoted.
    assert promise_of("local", 2, "most-advanced")["allows_loss"]
    assert "quorum" not in promise_of("on")


def test_lost_enqueues_the_old_primary_acknowledged_after_the_fault_are_counted_apart() -> None:
    events = [
        _event(1.0, "enqueued", "before"),
        _event(3.0, "enqueued", "cut-off"),
        _event(5.0, "enqueued", "resumed"),
        _event(9.0, "enqueued", "new"),
    ]
    failover = {
        "killed_at_s": 2.0, "primary_killed_s": 0.01, "promoted_at_s": 4.0, "promoted_s": 2.0,
        "resumed_s": 2.01, "demoted_s": 6.0,
    }  # fmt: skip
    judged = judge_failovers(
        level="asynchronous",
        keys=["before", "cut-off", "resumed", "new"],
        events=events,
        failovers=[failover],
        final={"new": ["pending", 0]},
    )
    assert judged["counts"]["lost_enqueues"] == 3
    # Struck at 2.0 s, demoted at 1.99 + 6.0 s: "cut-off" and "resumed" were acknowledged
    # by the old primary after the fault; "before" went into the failover, "new" to the new
    # primary.
    assert judged["counts"]["lost_from_the_old_primary_after_the_fault"] == 2
    killed = judge_failovers(
        level="asynchronous", keys=["before"], events=events[:1],
        failovers=[{"killed_at_s": 2.0, "promoted_at_s": 4.0}], final={},
    )  # fmt: skip
    assert "lost_from_the_old_primary_after_the_fault" not in killed["counts"]
