"""Group commit across processes: a writer waiting in line has its single claim or
acknowledgement carried by the transaction of the writer being served.

Two queues on one file stand for two processes (each has its own connection and its own
open file description of the turns sidecar, so the kernel treats their locks as two
owners'). The carrier holds the line; the follower's call runs in a thread, posts its
request and waits; the test then lets the carrier commit, roll back or vanish.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab import DurableQueue, JobState, ManualClock, SeededIds, StaleLease
from crashqueuelab.core import groupcommit, requestslots
from crashqueuelab.core import turns as turns_module
from crashqueuelab.core.groupcommit import SharedCommits
from crashqueuelab.core.hooks import Phase
from crashqueuelab.core.locking import begin_immediate
from crashqueuelab.core.requestslots import SlotState
from crashqueuelab.core.turns import Carried, Served, TurnLock, TurnTimeout
from crashqueuelab.judges.invariants import check_database
from crashqueuelab.judges.replay import replay_database
from tests.conftest import LEASE_US, RETRY, QueueFactory, fingerprint

WAIT_S = 10.0


def _announce_waits(
    lock: TurnLock, reached: threading.Event, served: threading.Event | None = None
) -> None:
    """Make ``lock`` set ``reached`` whenever it starts waiting in line, and ``served``
    when the line reaches its own ticket."""
    wait = lock._wait

    def announcing_wait(ticket: int, deadline: float, *, posted: bool) -> Served | Carried:
        reached.set()
        entry = wait(ticket, deadline, posted=posted)
        if served is not None and isinstance(entry, Served):
            served.set()
        return entry

    lock._wait = announcing_wait  # type: ignore[method-assign]


class Follower:
    """One queue call in a thread, on a queue of its own (a connection belongs to the thread
    that opened it); the constructor returns once the call has posted its request."""

    def __init__(self, open_queue: Callable[[], DurableQueue], call: Callable[[DurableQueue], Any]):
        self.posted = threading.Event()
        #: Set once the line reached the follower's own ticket.
        self.served = threading.Event()
        self.result: Any = None
        #: The follower queue's group-commit counts once its call returned.
        self.shared = SharedCommits()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(open_queue, call), daemon=True)
        self._thread.start()
        assert self.posted.wait(WAIT_S), "the follower never reached the line"

    def _run(
        self, open_queue: Callable[[], DurableQueue], call: Callable[[DurableQueue], Any]
    ) -> None:
        try:
            with open_queue() as queue:
                _announce_waits(queue._turns, self.posted, self.served)
                self.result = call(queue)
                self.shared = queue.shared_commits
        except BaseException as error:  # handed to the test, which re-raises it
            self.error = error
            self.posted.set()

    def join(self) -> Any:
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive(), "the follower is still waiting"
        if self.error is not None:
            raise self.error
        return self.result


Opener = Callable[[], DurableQueue]


@pytest.fixture
def phases() -> list[Phase]:
    return []


@pytest.fixture
def follower(db_path: Path, clock: ManualClock, phases: list[Phase]) -> Opener:
    """Opens a follower queue that records its hook's phases, group commit on."""
    return lambda: DurableQueue(
        db_path,
        clock=clock,
        ids=SeededIds(7, "follower"),
        retry=RETRY,
        hook=phases.append,
        group_commit=True,
    )


@pytest.fixture
def carrier(make_queue: QueueFactory) -> DurableQueue:
    return make_queue(stream="carrier")


def _behind_a_commit(
    carrier: DurableQueue, open_queue: Opener, call: Callable[[DurableQueue], Any]
) -> Follower:
    """``call`` made by a follower waiting in line behind the carrier, whose transaction
    then commits (carrying whatever the follower posted)."""
    ticket = carrier._turns.acquire(timeout_s=WAIT_S)
    waiting = Follower(open_queue, call)
    with carrier._transaction(Served(ticket, taken=False)):
        pass
    return waiting


def _submit(queue: DurableQueue, key: str = "k", payload: dict[str, Any] | None = None) -> str:
    return queue.submit(idempotency_key=key, job_type="t", payload=payload or {"k": key}).job.job_id


def _claim(queue: DurableQueue) -> Any:
    return queue.claim(worker_id="wf", lease_duration_us=LEASE_US)


def _succeed(job_id: str, token: str) -> Callable[[DurableQueue], Any]:
    return lambda queue: queue.succeed(job_id=job_id, worker_id="wf", lease_token=token)


def _event_types(queue: DurableQueue, job_id: str) -> list[str]:
    return [event.event_type.value for event in queue.history(job_id)]


#: How far a carrier got before it was killed: it had taken the request, had also run it
#: and noted its result, or had also committed.
STAGES = ["taken", "noted", "committed"]


def _carry_and_vanish(carrier: DurableQueue, ticket: int, stage: str) -> None:
    """The carrier takes the request behind it and gets as far as ``stage``, then is
    killed before it can finish its turn: the kernel drops its slot lock and the line
    skips it."""
    conn = carrier.connection
    begin_immediate(conn, timeout_s=WAIT_S)
    taken = carrier._turns.take(ticket, limit=4, timeout_s=WAIT_S)
    assert len(taken) == 1
    if stage != "taken":
        behind = [ticket for ticket, _ in taken]
        results = carrier._carry(taken)
        carrier._turns.note(list(zip(behind, results, strict=True)), timeout_s=WAIT_S)
    conn.execute("COMMIT" if stage == "committed" else "ROLLBACK")
    carrier._turns.close()


def _vanished(stage: str) -> SharedCommits:
    """What a follower counts when its carrier vanished at ``stage``."""
    committed = stage == "committed"
    return SharedCommits(
        carrier_vanished_applied=int(committed), carrier_vanished_rerun=int(not committed)
    )


def test_a_waiting_claim_and_acknowledgement_ride_the_carriers_commit(
    carrier: DurableQueue, follower: Opener, phases: list[Phase], db_path: Path
) -> None:
    job_id = _submit(carrier)

    waiting = _behind_a_commit(carrier, follower, _claim)
    claimed = waiting.join()
    assert claimed.job.job_id == job_id
    assert claimed.job.state is JobState.LEASED
    assert claimed.job.lease_worker_id == "wf"
    assert claimed.job == carrier.get(job_id)
    assert claimed.lease_deadline_us == claimed.job.lease_deadline_us
    # The follower's own transaction never ran: no BEFORE_* phase fired in it.
    assert phases == [Phase.AFTER_CLAIM_COMMIT]
    assert waiting.shared == SharedCommits(carried_by_others=1)

    waiting = _behind_a_commit(carrier, follower, _succeed(job_id, claimed.lease_token))
    done = waiting.join()
    assert waiting.shared == SharedCommits(carried_by_others=1)
    assert carrier.shared_commits == SharedCommits(carried_for_others=2)
    assert done.state is JobState.SUCCEEDED
    assert done == carrier.get(job_id)
    assert phases == [Phase.AFTER_CLAIM_COMMIT, Phase.AFTER_SUCCESS_COMMIT]
    assert _event_types(carrier, job_id) == ["SUBMITTED", "CLAIMED", "SUCCEEDED"]
    assert [attempt.lease_token for attempt in carrier.attempts(job_id)] == [claimed.lease_token]
    assert check_database(db_path).ok
    assert replay_database(db_path).ok


def test_nothing_to_claim_is_carried_as_none(
    carrier: DurableQueue,
    follower: Opener,
    phases: list[Phase],
) -> None:
    waiting = _behind_a_commit(carrier, follower, _claim)
    assert waiting.join() is None
    assert phases == []


def test_a_carrier_that_rolls_back_gives_the_request_back(
    carrier: DurableQueue,
    follower: Opener,
    phases: list[Phase],
) -> None:
    job_id = _submit(carrier)
    ticket = carrier._turns.acquire(timeout_s=WAIT_S)
    waiting = Follower(follower, _claim)
    with (
        pytest.raises(RuntimeError, match="carrier fails"),
        carrier._transaction(Served(ticket, taken=False)),
    ):
        raise RuntimeError("carrier fails")
    # Given back, the follower kept its place and ran the claim in its own turn.
    claimed = waiting.join()
    assert claimed.job.job_id == job_id
    assert waiting.shared == carrier.shared_commits == SharedCommits()
    assert phases == [Phase.BEFORE_CLAIM_COMMIT, Phase.AFTER_CLAIM_COMMIT]
    assert _event_types(carrier, job_id) == ["SUBMITTED", "CLAIMED"]


@pytest.mark.parametrize("stage", STAGES)
def test_a_carrier_that_vanishes_leaves_the_follower_what_its_commit_did(
    carrier: DurableQueue, follower: Opener, phases: list[Phase], db_path: Path, stage: str
) -> None:
    job_id = _submit(carrier)
    ticket = carrier._turns.acquire(timeout_s=WAIT_S)
    waiting = Follower(follower, _claim)
    _carry_and_vanish(carrier, ticket, stage)
    claimed = waiting.join()
    assert claimed.job.job_id == job_id
    assert claimed.job.lease_worker_id == "wf"
    assert waiting.shared == _vanished(stage)
    before = [] if stage == "committed" else [Phase.BEFORE_CLAIM_COMMIT]
    assert phases == [*before, Phase.AFTER_CLAIM_COMMIT]
    assert _event_types(carrier, job_id) == ["SUBMITTED", "CLAIMED"]
    assert check_database(db_path).ok
    assert replay_database(db_path).ok


def test_a_carrier_skipped_as_stuck_still_decides_what_it_carried(
    carrier: DurableQueue,
    follower: Opener,
    phases: list[Phase],
    db_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(turns_module, "STUCK_AFTER_S", 0.01)
    job_id = _submit(carrier)
    ticket = carrier._turns.acquire(timeout_s=WAIT_S)
    waiting = Follower(follower, _claim)
    conn = carrier.connection
    begin_immediate(conn, timeout_s=WAIT_S)
    taken = carrier._turns.take(ticket, limit=4, timeout_s=WAIT_S)
    # The carrier stalls with the request taken: the line moves on to the follower, whose
    # own transaction must wait for the carrier's to end before it looks at the database.
    assert waiting.served.wait(WAIT_S)
    behind = [ticket for ticket, _ in taken]
    carrier._turns.note(list(zip(behind, carrier._carry(taken), strict=True)), timeout_s=WAIT_S)
    conn.execute("COMMIT")
    claimed = waiting.join()
    # Back late, the carrier cannot mark the request done or move the line back.
    carrier._turns.finish(ticket, behind, timeout_s=WAIT_S)
    assert claimed.job.job_id == job_id
    assert phases == [Phase.AFTER_CLAIM_COMMIT]
    assert _event_types(carrier, job_id) == ["SUBMITTED", "CLAIMED"]
    assert carrier._turns.acquire(timeout_s=WAIT_S) == ticket + 2
    assert replay_database(db_path).ok


@pytest.mark.parametrize("stage", STAGES)
def test_an_acknowledgement_whose_carrier_vanished_is_applied_once(
    carrier: DurableQueue, follower: Opener, phases: list[Phase], db_path: Path, stage: str
) -> None:
    job_id = _submit(carrier)
    claimed = carrier.claim(worker_id="wf", lease_duration_us=LEASE_US)
    assert claimed is not None
    ticket = carrier._turns.acquire(timeout_s=WAIT_S)
    waiting = Follower(follower, _succeed(job_id, claimed.lease_token))
    _carry_and_vanish(carrier, ticket, stage)
    assert waiting.join().state is JobState.SUCCEEDED
    assert waiting.shared == _vanished(stage)
    before = [] if stage == "committed" else [Phase.BEFORE_SUCCESS_COMMIT]
    assert phases == [*before, Phase.AFTER_SUCCESS_COMMIT]
    assert _event_types(carrier, job_id) == ["SUBMITTED", "CLAIMED", "SUCCEEDED"]
    assert replay_database(db_path).ok


@pytest.mark.parametrize("stage", STAGES)
def test_a_repeated_acknowledgement_whose_carrier_vanished_is_still_refused(
    carrier: DurableQueue, follower: Opener, db_path: Path, stage: str
) -> None:
    """The lease already ended in success: whatever its carrier got to, the repeat is stale
    (a success under the same lease token is not this request's own)."""
    job_id = _submit(carrier)
    claimed = carrier.claim(worker_id="wf", lease_duration_us=LEASE_US)
    assert claimed is not None
    carrier.succeed(job_id=job_id, worker_id="wf", lease_token=claimed.lease_token)
    ticket = carrier._turns.acquire(timeout_s=WAIT_S)
    waiting = Follower(follower, _succeed(job_id, claimed.lease_token))
    _carry_and_vanish(carrier, ticket, stage)
    with pytest.raises(StaleLease):
        waiting.join()
    assert _event_types(carrier, job_id) == ["SUBMITTED", "CLAIMED", "SUCCEEDED"]
    assert replay_database(db_path).ok


def _chain(job_id: str, token: str) -> Callable[[DurableQueue], Any]:
    return lambda queue: queue.succeed_and_claim(
        job_id=job_id, worker_id="wf", lease_token=token, lease_duration_us=LEASE_US
    )


@pytest.mark.parametrize("waiting_jobs", [1, 0], ids=["next-job", "no-next-job"])
def test_an_acknowledgement_with_the_next_claim_rides_the_carriers_commit(
    carrier: DurableQueue, follower: Opener, phases: list[Phase], db_path: Path, waiting_jobs: int
) -> None:
    job_id = _submit(carrier)
    following = [_submit(carrier, f"next-{n}") for n in range(waiting_jobs)]
    claimed = carrier.claim(worker_id="wf", lease_duration_us=LEASE_US)
    assert claimed is not None
    waiting = _behind_a_commit(carrier, follower, _chain(job_id, claimed.lease_token))
    done, next_claim = waiting.join()
    assert done == carrier.get(job_id)
    assert done.state is JobState.SUCCEEDED
    if following:
        assert next_claim.job == carrier.get(following[0])
        assert next_claim.job.lease_worker_id == "wf"
        assert phases == [Phase.AFTER_SUCCESS_COMMIT, Phase.AFTER_CLAIM_COMMIT]
    else:
        assert next_claim is None
        assert phases == [Phase.AFTER_SUCCESS_COMMIT]
    assert check_database(db_path).ok
    assert replay_database(db_path).ok


@pytest.mark.parametrize("stage", STAGES)
def test_a_chained_call_whose_carrier_vanished_is_applied_once(
    carrier: DurableQueue, follower: Opener, phases: list[Phase], db_path: Path, stage: str
) -> None:
    job_id, next_id = _submit(carrier), _submit(carrier, "next")
    claimed = carrier.claim(worker_id="wf", lease_duration_us=LEASE_US)
    assert claimed is not None
    ticket = carrier._turns.acquire(timeout_s=WAIT_S)
    waiting = Follower(follower, _chain(job_id, claimed.lease_token))
    _carry_and_vanish(carrier, ticket, stage)
    done, next_claim = waiting.join()
    assert done.state is JobState.SUCCEEDED
    assert next_claim.job.job_id == next_id
    assert waiting.shared == _vanished(stage)
    before = [Phase.BEFORE_SUCCESS_COMMIT, Phase.BEFORE_CLAIM_COMMIT]
    if stage == "committed":
        before = []
    assert phases == [*before, Phase.AFTER_SUCCESS_COMMIT, Phase.AFTER_CLAIM_COMMIT]
    assert _event_types(carrier, next_id) == ["SUBMITTED", "CLAIMED"]
    assert replay_database(db_path).ok


@pytest.mark.parametrize("chained", [False, True], ids=["succeed", "succeed_and_claim"])
def test_a_stale_acknowledgement_is_given_back_and_raises_in_its_own_turn(
    carrier: DurableQueue, follower: Opener, phases: list[Phase], db_path: Path, chained: bool
) -> None:
    job_id = _submit(carrier)
    _submit(carrier, "next")
    assert carrier.claim(worker_id="wf", lease_duration_us=LEASE_US) is not None
    before = fingerprint(db_path)
    waiting = _behind_a_commit(
        carrier, follower, (_chain if chained else _succeed)(job_id, "forged")
    )
    with pytest.raises(StaleLease):
        waiting.join()
    assert phases == []
    assert fingerprint(db_path) == before


def test_a_claimed_row_too_large_for_its_slot_is_given_back(
    carrier: DurableQueue,
    follower: Opener,
    phases: list[Phase],
) -> None:
    job_id = _submit(carrier, payload={"blob": "x" * (requestslots.RESULT_MAX + 1)})
    waiting = _behind_a_commit(carrier, follower, _claim)
    claimed = waiting.join()
    assert claimed.job.job_id == job_id
    # The carrier's claim was rolled back to its savepoint; the follower claimed it itself.
    assert phases == [Phase.BEFORE_CLAIM_COMMIT, Phase.AFTER_CLAIM_COMMIT]
    assert _event_types(carrier, job_id) == ["SUBMITTED", "CLAIMED"]


def test_a_hooked_queue_keeps_every_transition_in_its_own_transaction(
    carrier: DurableQueue, db_path: Path, clock: ManualClock, phases: list[Phase]
) -> None:
    job_id = _submit(carrier)
    ticket = carrier._turns.acquire(timeout_s=WAIT_S)
    hooked = lambda: DurableQueue(db_path, clock=clock, retry=RETRY, hook=phases.append)  # noqa: E731
    waiting = Follower(hooked, _claim)
    with carrier._transaction(Served(ticket, taken=False)):
        pass
    assert waiting.join().job.job_id == job_id
    assert waiting.served.is_set()
    assert phases == [Phase.BEFORE_CLAIM_COMMIT, Phase.AFTER_CLAIM_COMMIT]


def test_a_closed_queue_refuses_before_it_joins_the_line(make_queue: QueueFactory) -> None:
    queue = make_queue()
    queue.close()
    with pytest.raises(Exception, match="closed"):
        queue.claim(worker_id="w", lease_duration_us=LEASE_US)


@pytest.fixture
def line(tmp_path: Path) -> Iterator[tuple[TurnLock, TurnLock, int]]:
    holder, waiter = TurnLock(tmp_path / "q-turns"), TurnLock(tmp_path / "q-turns")
    fd = os.open(tmp_path / "q-turns", os.O_RDONLY)
    try:
        yield holder, waiter, fd
    finally:
        os.close(fd)
        holder.close()
        waiter.close()


def test_a_request_of_a_writer_that_died_waiting_is_not_taken(
    line: tuple[TurnLock, TurnLock, int],
) -> None:
    holder, waiter, fd = line
    ticket = holder.acquire(timeout_s=WAIT_S)
    behind, served = waiter._take_ticket(lambda: b"request", time.monotonic() + WAIT_S)
    assert (behind, served) == (ticket + 1, False)
    assert requestslots.read_header(fd, behind).state is SlotState.POSTED
    waiter.close()  # killed while waiting: the kernel drops its slot lock
    assert holder.take(ticket, limit=4, timeout_s=WAIT_S) == []
    holder.release(ticket)


def test_a_request_the_carrier_cannot_read_is_given_back(
    carrier: DurableQueue, db_path: Path
) -> None:
    before = fingerprint(db_path)
    ticket = carrier._turns.acquire(timeout_s=WAIT_S)
    waiter = TurnLock(Path(f"{db_path}-turns"))
    fd = os.open(f"{db_path}-turns", os.O_RDONLY)
    try:
        behind, _ = waiter._take_ticket(lambda: b'["claim", 1]', time.monotonic() + WAIT_S)
        with carrier._transaction(Served(ticket, taken=False)):
            pass
        assert requestslots.read_header(fd, behind).state is SlotState.REFUSED
    finally:
        os.close(fd)
        waiter.close()
    assert fingerprint(db_path) == before


def test_a_request_given_up_at_its_deadline_leaves_its_slot_empty(
    line: tuple[TurnLock, TurnLock, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(turns_module, "STUCK_AFTER_S", 60.0)
    holder, waiter, fd = line
    ticket = holder.acquire(timeout_s=WAIT_S)
    with pytest.raises(TurnTimeout, match=r"not served in time$"):
        waiter.enter(lambda: b"request", timeout_s=0.05)
    assert requestslots.read_header(fd, ticket + 1).state is SlotState.EMPTY
    assert holder.take(ticket, limit=4, timeout_s=WAIT_S) == []
    holder.release(ticket)


def test_a_request_taken_when_its_writer_gives_up_is_reported_as_maybe_committed(
    line: tuple[TurnLock, TurnLock, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(turns_module, "STUCK_AFTER_S", 60.0)
    holder, waiter, fd = line
    ticket = holder.acquire(timeout_s=WAIT_S)
    caught: list[BaseException] = []
    posted = threading.Event()
    _announce_waits(waiter, posted)

    def enter() -> None:
        try:
            # Long enough for the holder to take the request first on a loaded host too.
            waiter.enter(lambda: b"request", timeout_s=1.0)
        except TurnTimeout as error:
            caught.append(error)

    thread = threading.Thread(target=enter, daemon=True)
    thread.start()
    assert posted.wait(WAIT_S)
    assert holder.take(ticket, limit=4, timeout_s=WAIT_S) == [(ticket + 1, b"request")]
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert len(caught) == 1
    assert "may commit it" in str(caught[0])
    # Out of reach of the late carrier: finishing marks nothing done.
    holder.finish(ticket, [ticket + 1], timeout_s=WAIT_S)
    assert requestslots.read_header(fd, ticket + 1).state is SlotState.EMPTY


def test_a_request_too_long_for_a_slot_is_not_posted(
    line: tuple[TurnLock, TurnLock, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(turns_module, "STUCK_AFTER_S", 60.0)
    holder, waiter, fd = line
    ticket = holder.acquire(timeout_s=WAIT_S)
    with pytest.raises(TurnTimeout):
        waiter.enter(lambda: b"x" * (requestslots.REQUEST_MAX + 1), timeout_s=0.05)
    assert requestslots.read_header(fd, ticket + 1).state is SlotState.EMPTY
    holder.release(ticket)


def test_requests_round_trip_and_anything_else_is_refused() -> None:
    claim = groupcommit.claim_request("w", "t", 5, 7)
    success = groupcommit.success_request("j", "w", "t", 7)
    assert groupcommit.decode_request(claim) == groupcommit.ClaimRequest("w", "t", 5, 7)
    assert groupcommit.decode_request(success) == groupcommit.SuccessRequest("j", "w", "t", 7)
    chain = groupcommit.chain_request("j", "w", "t", "n", 5, 7)
    assert groupcommit.decode_request(chain) == groupcommit.ChainRequest("j", "w", "t", "n", 5, 7)
    for damaged in (b"", b"\xff", b"{}", b'["claim","w","t","5",7]', b'["other",1]', b"[]"):
        assert groupcommit.decode_request(damaged) is None
    assert groupcommit.decode_claim(b"null", "t") is None
    assert groupcommit.encode_claim(None) == b"null"


def test_a_claim_result_naming_another_lease_is_refused(queue: DurableQueue) -> None:
    _submit(queue)
    claimed = queue.claim(worker_id="w", lease_duration_us=LEASE_US)
    result = groupcommit.encode_claim(claimed)
    assert result is not None
    assert claimed is not None
    assert groupcommit.decode_claim(result, claimed.lease_token) == claimed
    with pytest.raises(ValueError, match="another lease"):
        groupcommit.decode_claim(result, "someone-else")


def test_group_commit_is_on_by_default_without_a_hook(
    carrier: DurableQueue, db_path: Path, clock: ManualClock
) -> None:
    job_id = _submit(carrier)
    waiting = _behind_a_commit(
        carrier, lambda: DurableQueue(db_path, clock=clock, retry=RETRY), _claim
    )
    assert waiting.join().job.job_id == job_id
    assert not waiting.served.is_set()


def test_a_lone_writer_posts_nothing(queue: DurableQueue, db_path: Path) -> None:
    _submit(queue)
    assert queue.claim(worker_id="w", lease_duration_us=LEASE_US) is not None
    fd = os.open(f"{db_path}-turns", os.O_RDONLY)
    try:
        headers = [requestslots.read_header(fd, ticket) for ticket in range(4)]
    finally:
        os.close(fd)
    assert {header.state for header in headers} == {SlotState.EMPTY}
    assert {header.request_length for header in headers} == {0}
