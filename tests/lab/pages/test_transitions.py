"""A store's history on a page is a table of transitions a person reads: the job by its
key, from which state to which, whose lease (shortened), seconds from the case's start,
recovery told apart; never a dump of the stored row."""

from __future__ import annotations

import json

from crashqueuelab.lab.pages.tokens import short_names
from crashqueuelab.lab.pages.transitions import OTHER_TEXT, seconds_text, store_transitions

START = 1_000_000_000
RECOVERY = START + 3_600_000_000


def sqlite_event(
    seq: int, kind: str, before: str | None, after: str, at: int, **more: object
) -> dict[str, object]:
    return {"seq": seq, "event_type": kind, "from_state": before, "to_state": after,
            "at_us": at, "attempt": 0, "worker_id": None, "lease_token": None,
            "lease_deadline_us": None, "available_at_us": None, "error": None,
            "detail": None} | more  # fmt: skip


def test_sqlite_events_read_as_named_jobs_moving_between_states_by_shortened_leases() -> None:
    submitted = json.dumps(
        {"idempotency_key": "07-case/effect", "max_attempts": 3, "payload_sha256": "e8" * 32}
    )
    history = [
        sqlite_event(1, "SUBMITTED", None, "QUEUED", START, job_id="job-9ddd87204765db4f",
                     detail=submitted),
        sqlite_event(2, "CLAIMED", "QUEUED", "LEASED", START + 1_000, attempt=1,
                     job_id="job-9ddd87204765db4f", worker_id="worker-a",
                     lease_token="lease-d4587328cb5c41f8", lease_deadline_us=START + 5_001_000),
        sqlite_event(3, "LEASE_EXPIRED", "LEASED", "RETRY_SCHEDULED", RECOVERY + 13_000_000,
                     attempt=1, job_id="job-9ddd87204765db4f", worker_id="worker-a",
                     lease_token="lease-d4587328cb5c41f8", available_at_us=RECOVERY + 14_000_000,
                     error="lease expired before the worker acknowledged"),
        sqlite_event(4, "CLAIMED", "QUEUED", "LEASED", RECOVERY + 26_000_000, attempt=2,
                     job_id="job-9ddd87204765db4f", worker_id="worker-recovery",
                     lease_token="lease-d4aa0000cb5c41f8", lease_deadline_us=RECOVERY + 31e6),
        sqlite_event(5, "SUBMITTED", None, "QUEUED", START, job_id="job-c6bfd6d57efd369f"),
        sqlite_event(6, "SUBMITTED", None, "QUEUED", START, job_id="job-0", detail="not json"),
        sqlite_event(7, "SUBMITTED", None, "QUEUED", START, job_id="job-1", detail="[1]"),
    ]  # fmt: skip
    rows = store_transitions(history, origin_us=START, recovery_us=RECOVERY, job_prefix="07-case/")
    submit, claim, expiry, again, unnamed, *odd = rows
    assert (submit["at"], submit["job"], submit["change"], submit["event"]) == (
        "0 s",
        "effect",
        "— → QUEUED",
        "submitted",
    )
    assert submit["note"] == "up to 3 attempts"  # not the payload's digest
    assert "e8e8" not in json.dumps(rows)
    assert (claim["at"], claim["change"]) == ("0.001 s", "QUEUED → LEASED")
    assert claim["holder"] == "worker-a"
    assert claim["note"] == "attempt 1; lease until 5.001 s"
    # Two tokens that share "d4": each shown by the shortest prefix that tells them apart.
    assert (claim["lease"], again["lease"]) == ("d458…", "d4aa…")
    assert claim["lease_title"] == "lease-d4587328cb5c41f8"
    assert expiry["change"] == "LEASED → RETRY_SCHEDULED"
    assert expiry["event"] == "lease expired"
    assert expiry["at"] == "3,613 s"
    assert expiry["note"] == (
        "attempt 1; retry from 3,614 s; lease expired before the worker acknowledged"
    )
    assert [row["phase"] for row in rows] == ["workload", "workload", "recovery", "recovery",
                                              "workload", "workload", "workload"]  # fmt: skip
    # A job no submission names is shown by its id, shortened.
    assert unnamed["job"] == "job c6bf…"
    assert unnamed["job_title"] == "job-c6bfd6d57efd369f"
    # A detail that is not the queue's JSON object names nothing and breaks nothing.
    assert [(row["job"], row["note"]) for row in odd] == [("job 0", ""), ("job 1", "")]


def test_walqueue_frames_are_followed_to_the_states_walqueue_gives_each_task() -> None:
    task = "03-case/flaky"
    put = {
        "seq": 1,
        "type": "put",
        "tasks": [
            {
                "task_id": task,
                "key": task,
                "max_attempts": 2,
                "available_at": 0,
                "payload": {"body": {"value": 11}, "job_type": "synthetic.flaky"},
            }
        ],
    }
    history = [
        put,
        {"seq": 2, "type": "reserve", "now": START + 2_000, "lease_seconds": 5_000_000,
         "task_ids": [task], "worker": "worker-a"},
        {"seq": 3, "type": "release", "now": START + 2_000, "delay": 1_000_000,
         "generation": 1, "task_id": task, "worker": "worker-a"},
        {"seq": 4, "type": "reserve", "now": START + 1_002_000, "lease_seconds": 5_000_000,
         "task_ids": [task], "worker": "worker-vanished"},
        {"seq": 5, "type": "expire", "now": RECOVERY + 13_000_000, "task_ids": [task]},
        {"seq": 6, "type": "ack", "now": RECOVERY, "generation": 9, "task_id": "other",
         "worker": "worker-recovery"},
    ]  # fmt: skip
    rows = store_transitions(history, origin_us=START, recovery_us=RECOVERY, job_prefix="03-case/")
    assert [(row["job"], row["change"], row["event"]) for row in rows] == [
        ("flaky", "— → ready", "put"),
        ("flaky", "ready → leased", "reserve"),
        ("flaky", "leased → ready", "release"),
        ("flaky", "ready → leased", "reserve"),
        # Its second attempt of two: an expired lease ends it dead.
        ("flaky", "leased → dead", "lease expired"),
        # A task the history never put (it sits in a snapshot): its state before is unknown.
        ("other", "? → completed", "ack"),
    ]
    assert rows[0]["at"] == ""  # walqueue keeps no time for a put: none is made up
    assert rows[1]["note"] == "attempt 1, lease until 5.002 s"
    assert rows[2]["note"] == "retry from 1.002 s"
    # walqueue names a lease by its holder and its generation.
    leases = [row["lease"] for row in rows]
    assert leases == ["", *[f"generation {n}" for n in (1, 1, 2, 2, 9)]]
    assert rows[4]["holder"] == "worker-vanished"  # whose lease expired
    assert [row["phase"] for row in rows] == ["workload"] * 4 + ["recovery"] * 2


def test_an_entry_of_another_shape_is_shown_short_as_text() -> None:
    long = {"type": "compact", "now": START, "segments": list(range(200))}
    short = {"type": "rotate", "task_id": "02-case/effect", "segment": 3, "note": None}
    cut, whole = store_transitions([long, short], origin_us=START, job_prefix="02-case/")
    assert cut["event"] == "compact"
    assert cut["note"].startswith("segments=[0, 1, 2")
    assert len(cut["note"]) == OTHER_TEXT
    assert cut["phase"] == "workload"
    assert (whole["job"], whole["note"], whole["at"]) == ("effect", "segment=3", "")


def test_times_read_as_seconds_from_the_start() -> None:
    assert seconds_text(START, START) == "0 s"
    assert seconds_text(START + 1_000, START) == "0.001 s"
    assert seconds_text(START + 3_613_000_000, START) == "3,613 s"


def test_tokens_are_shortened_to_the_shortest_prefix_that_tells_them_apart() -> None:
    names = short_names(
        ["lease-d4587328cb5c41f8", "lease-d4587399cb5c41f8", "lease-abcdef", "job-1234567890",
         "6ce143f445c545b5a0bebab0bf04d4ff", "t1", "lease-d45873"]
    )  # fmt: skip
    assert names == {
        "lease-d4587328cb5c41f8": "d458732…",
        "lease-d4587399cb5c41f8": "d458739…",
        "lease-abcdef": "abcdef",  # an ellipsis would save nothing
        "lease-d45873": "d45873",  # the start of two others: shown whole
        "job-1234567890": "job 1234…",
        "6ce143f445c545b5a0bebab0bf04d4ff": "6ce1…",
        "t1": "t1",
    }
