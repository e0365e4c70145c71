"""The RabbitMQ judge on hand-made artifacts: each kind of finding, the queue left not empty,
and the verdict against each queue type's promise (a mirrored queue's loss documented only
where no mirror was synchronised and RabbitMQ may promote such a mirror). And
``rabbitmqctl list_queues`` as the judges parse it."""

from __future__ import annotations

from typing import Any

import pytest

from crashqueuelab.lab.failover.deliveries import judge_deliveries
from crashqueuelab.lab.failover.promises import rabbit_promise
from crashqueuelab.lab.failover.rabbitcluster import nodes_in, parse_queues

KEYS = ["a", "b", "c", "d"]


def _event(
    at_s: float, event: str, key: str, copy: int, redelivered: bool = False
) -> dict[str, Any]:
    return {"at_s": at_s, "event": event, "key": key, "copy": copy, "redelivered": redelivered}


def _events() -> list[dict[str, Any]]:
    return [
        _event(0.1, "enqueued", "a", 1),
        _event(0.2, "executed", "a", 1),
        _event(0.3, "completed", "a", 1),
        _event(1.0, "enqueued", "b", 2),  # confirmed, never delivered: lost
        _event(0.4, "enqueued", "c", 3),
        _event(1.3, "executed", "c", 3),
        _event(1.4, "completed", "c", 3),
        _event(3.0, "executed", "c", 3, redelivered=True),  # the same message again
        _event(3.1, "completed", "c", 3, redelivered=True),
        _event(0.5, "executed", "d", 4),  # delivered, its confirm lost...
        _event(0.6, "completed", "d", 4),
        {"at_s": 0.7, "event": "enqueue-failed", "key": "d", "copy": 4, "error": "StreamLostError"},
        _event(0.8, "enqueued", "d", 5),  # ...so published again: a second copy
        _event(0.9, "executed", "d", 5),
        {"at_s": 1.5, "event": "call-failed", "key": None, "call": "consume"},
    ]


def _failovers(synchronised: list[str]) -> list[dict[str, Any]]:
    return [
        {"killed_at_s": 2.0, "promoted_at_s": 2.5, "before": {"synchronised_mirrors": synchronised}}
    ]


def test_each_kind_of_finding_is_found_from_the_ledger_and_the_empty_queue() -> None:
    found = judge_deliveries(
        promise=rabbit_promise("quorum", "manual", "always"),
        keys=KEYS,
        events=_events(),
        failovers=_failovers([]),
        messages_left=0,
    )
    assert found["lost_enqueues"] == [{"key": "b", "acknowledged_at_s": 1.0, "failover": 0}]
    assert found["resurrected_completions"] == [
        {
            "key": "c",
            "copy": 3,
            "acknowledged_at_s": 1.4,
            "delivered_again_at_s": 3.0,
            "redelivered_flag": True,
            "failover": 0,
        }
    ]
    assert [item["key"] for item in found["duplicate_effects"]] == ["c", "d"]
    assert found["duplicate_effects"][1] == {
        "key": "d",
        "deliveries": 2,
        "copies_delivered": 2,
        "acknowledged_at_s": 0.6,
        "same_message_again": False,
    }
    assert found["counts"] == {
        "lost_enqueues": 1,
        "resurrected_completions": 1,
        "duplicate_effects": 2,
        "undelivered": 0,
        "jobs_affected": 3,
    }
    assert found["enqueues_acknowledged"] == 4
    # d's first copy was delivered, but its confirm never came: only its second counts.
    assert found["copies_confirmed"] == 4
    assert found["jobs_confirmed_twice"] == []
    # A quorum queue promises no confirmed message is lost: that one is a broken promise,
    # the redeliveries are documented.
    assert found["broken_promises"] == 1
    assert found["documented"] == 3
    assert not found["ok"]
    assert not found["contract_held"]


def test_with_messages_left_an_undelivered_job_is_listed_not_judged_lost() -> None:
    found = judge_deliveries(
        promise=rabbit_promise("quorum", "manual", "always"),
        keys=KEYS,
        events=_events(),
        failovers=[],
        messages_left=1,
    )
    assert found["lost_enqueues"] == []
    assert found["undelivered"] == ["b"]
    assert found["counts"]["undelivered"] == 1


@pytest.mark.parametrize(
    ("promote_on_failure", "synchronised", "broken"),
    [
        ("always", [], 0),  # an unsynchronised mirror promoted: documented
        ("always", ["rabbit@b"], 1),  # a synchronised mirror was there: broken
        ("when-synced", [], 1),  # RabbitMQ may not promote it: broken
    ],
)
def test_a_mirrored_queue_may_lose_a_confirmed_message_only_without_a_synchronised_mirror(
    promote_on_failure: str, synchronised: list[str], broken: int
) -> None:
    found = judge_deliveries(
        promise=rabbit_promise("mirrored", "manual", promote_on_failure),
        keys=KEYS,
        events=_events(),
        failovers=_failovers(synchronised),
        messages_left=0,
    )
    assert found["counts"]["lost_enqueues"] == 1
    assert found["broken_promises"] == broken
    assert found["promise"]["setting"].startswith("classic mirrored queue (ha-mode: all")
    assert f"ha-promote-on-failure: {promote_on_failure}" in found["level"]


def test_a_loss_outside_every_failover_is_a_broken_promise_even_where_loss_is_allowed() -> None:
    events = [_event(9.0, "enqueued", "a", 1)]
    found = judge_deliveries(
        promise=rabbit_promise("mirrored", "manual", "always"),
        keys=["a"],
        events=events,
        failovers=_failovers([]),
        messages_left=0,
    )
    assert found["lost_enqueues"][0]["failover"] is None
    assert found["broken_promises"] == 1


def test_rabbitmqctl_list_queues_is_parsed_per_queue_type() -> None:
    said = (
        "m\tclassic\ttrue\tcrashqueuelab-ha\t3\t2\t1\t2"
        "\t<n1@localhost.1796449251.708.0>"
        "\t[<n2@localhost.1796449251.1.0>, <n3@localhost.1796449251.2.0>]"
        "\t[<n2@localhost.1796449251.1.0>]\t\t\t\n"
        "q\tquorum\ttrue\t\t0\t0\t0\t1\t<n1@localhost.1.694.0>\t\t\tn2@localhost"
        "\t[n1@localhost, n2@localhost, n3@localhost]\t[n2@localhost, n3@localhost]\n"
        "a line of something else\n"
    )
    queues = parse_queues(said)
    assert queues["m"] == {
        "type": "classic",
        "durable": True,
        "policy": "crashqueuelab-ha",
        "messages": 3,
        "messages_ready": 2,
        "messages_unacknowledged": 1,
        "consumers": 2,
        "leader": "n1@localhost",
        "mirrors": ["n2@localhost", "n3@localhost"],
        "synchronised_mirrors": ["n2@localhost"],
    }
    assert queues["q"]["leader"] == "n2@localhost"
    assert queues["q"]["members"] == ["n1@localhost", "n2@localhost", "n3@localhost"]
    assert queues["q"]["online"] == ["n2@localhost", "n3@localhost"]
    assert nodes_in("[]") == []
