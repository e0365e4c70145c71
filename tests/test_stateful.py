"""DurableQueue against the in-memory model over random operation sequences.

After every step the two must agree on every job, and the judges must pass the database.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, precondition, rule

from crashqueuelab import (
    DurableQueue,
    IdempotencyConflict,
    ManualClock,
    RetryPolicy,
    SeededIds,
    StaleLease,
)
from crashqueuelab.core.models import Acknowledgement
from crashqueuelab.judges.invariants import check_database
from crashqueuelab.judges.replay import replay_database
from tests.model import ModelQueue

WORKERS = st.sampled_from(["w1", "w2", "w3"])
KEYS = st.sampled_from(["a", "b", "c", "d", "e", "f"])
PAYLOADS = st.sampled_from([{}, {"v": 1}, {"v": 2}])
DURATIONS = st.integers(min_value=1, max_value=3_000)


class QueueAgainstModel(RuleBasedStateMachine):
    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.TemporaryDirectory()
        self.path = Path(self.directory.name) / "queue.sqlite"
        self.clock = ManualClock(1_000)
        self.queue = DurableQueue(
            self.path,
            clock=self.clock,
            ids=SeededIds(1, "stateful"),
            retry=RetryPolicy(base_delay_us=100, max_delay_us=150),
        )
        self.model = ModelQueue(base_delay=100, max_delay=150)

    def teardown(self) -> None:
        self.queue.close()
        self.directory.cleanup()

    @rule(
        key=KEYS,
        job_type=st.sampled_from(["t", "u"]),
        payload=PAYLOADS,
        max_attempts=st.integers(1, 4),
    )
    def submit(self, key: str, job_type: str, payload: dict[str, int], max_attempts: int) -> None:
        try:
            result = self.queue.submit(
                idempotency_key=key, job_type=job_type, payload=payload, max_attempts=max_attempts
            )
            outcome = "created" if result.created else "existing"
            job_id = result.job.job_id
        except IdempotencyConflict:
            outcome, job_id = "conflict", ""
        expected = self.model.submit(
            job_id, key, job_type, repr(sorted(payload.items())), max_attempts, self.clock.now_us()
        )
        assert outcome == expected

    @rule(target=leases, worker=WORKERS, duration=DURATIONS)
    def claim(self, worker: str, duration: int) -> tuple[str, str, str]:
        expected = self.model.next_ready(self.clock.now_us())
        claimed = self.queue.claim(worker_id=worker, lease_duration_us=duration)
        if claimed is None:
            assert expected is None
            return ("", worker, "")
        assert claimed.job.job_id == expected
        self.model.claim(expected, worker, claimed.lease_token, claimed.lease_deadline_us)
        return (expected, worker, claimed.lease_token)

    def _holder_call(
        self, lease: tuple[str, str, str], imposter: bool, operation: str, duration: int = 1
    ) -> None:
        job_id, worker, token = lease
        if not job_id:
            return
        if imposter:
            worker = worker + "-imposter"
        reason = self.model.stale_reason(job_id, worker, token, self.clock.now_us())
        try:
            if operation == "heartbeat":
                self.queue.heartbeat(
                    job_id=job_id, worker_id=worker, lease_token=token, lease_duration_us=duration
                )
            elif operation == "succeed":
                self.queue.succeed(job_id=job_id, worker_id=worker, lease_token=token)
            else:
                self.queue.fail(job_id=job_id, worker_id=worker, lease_token=token, error="boom")
            verdict = None
        except StaleLease as error:
            verdict = error.reason.value
        assert verdict == reason
        if reason is not None:
            return
        if operation == "heartbeat":
            self.model.jobs[job_id].deadline = self.clock.now_us() + duration
        elif operation == "succeed":
            self.model.succeed(job_id)
        else:
            self.model.fail(job_id, self.clock.now_us())

    @rule(
        lease=leases,
        imposter=st.booleans(),
        operation=st.sampled_from(["heartbeat", "succeed", "fail"]),
        duration=DURATIONS,
    )
    def use_a_remembered_lease(
        self, lease: tuple[str, str, str], imposter: bool, operation: str, duration: int
    ) -> None:
        """Old, current or forged credentials: the queue must agree with the model's verdict."""
        self._holder_call(lease, imposter, operation, duration)

    def _live_leases(self) -> list[tuple[str, str, str]]:
        return sorted(
            (job_id, job.worker or "", job.token or "")
            for job_id, job in self.model.jobs.items()
            if job.state == "LEASED"
        )

    @precondition(lambda self: bool(self._live_leases()))
    @rule(pick=st.integers(min_value=0, max_value=10), succeed=st.booleans())
    def finish_a_live_lease(self, pick: int, succeed: bool) -> None:
        """Drive the holder of a current lease, so long retry chains get explored."""
        live = self._live_leases()
        self._holder_call(live[pick % len(live)], False, "succeed" if succeed else "fail")

    @precondition(lambda self: bool(self._live_leases()))
    @rule(target=leases, pick=st.integers(min_value=0, max_value=10), duration=DURATIONS)
    def succeed_and_claim_next(self, pick: int, duration: int) -> tuple[str, str, str]:
        """The chained path: acknowledge a live lease and lease the next job in one commit."""
        job_id, worker, token = self._live_leases()[pick % len(self._live_leases())]
        reason = self.model.stale_reason(job_id, worker, token, self.clock.now_us())
        try:
            _, claimed = self.queue.succeed_and_claim(
                job_id=job_id, worker_id=worker, lease_token=token, lease_duration_us=duration
            )
            verdict = None
        except StaleLease as error:
            verdict, claimed = error.reason.value, None
        assert verdict == reason
        if reason is not None:
            return ("", worker, "")
        self.model.succeed(job_id)
        expected = self.model.next_ready(self.clock.now_us())
        assert (claimed.job.job_id if claimed else None) == expected
        if claimed is None or expected is None:
            return ("", worker, "")
        self.model.claim(expected, worker, claimed.lease_token, claimed.lease_deadline_us)
        return (expected, worker, claimed.lease_token)

    @rule(keys=st.lists(KEYS, min_size=1, max_size=4), payload=PAYLOADS)
    def submit_batch(self, keys: list[str], payload: dict[str, int]) -> None:
        requests = [{"idempotency_key": k, "job_type": "t", "payload": payload} for k in keys]
        # The model applies the batch to a copy, so a conflict leaves it untouched.
        trial = copy.deepcopy(self.model)
        outcomes = [
            trial.submit(
                f"pending-{n}", k, "t", repr(sorted(payload.items())), 3, self.clock.now_us()
            )
            for n, k in enumerate(keys)
        ]
        try:
            results = self.queue.submit_many(requests)
        except IdempotencyConflict:
            assert "conflict" in outcomes
            return
        assert "conflict" not in outcomes
        for result, key in zip(results, keys, strict=True):
            self.model.submit(
                result.job.job_id, key, "t", repr(sorted(payload.items())), 3, self.clock.now_us()
            )
        assert [r.created for r in results] == [o == "created" for o in outcomes]

    @rule(worker=WORKERS, duration=DURATIONS, limit=st.integers(min_value=1, max_value=4))
    def claim_batch(self, worker: str, duration: int, limit: int) -> None:
        claimed = self.queue.claim_many(worker_id=worker, lease_duration_us=duration, limit=limit)
        for job in claimed:
            expected = self.model.next_ready(self.clock.now_us())
            assert job.job.job_id == expected
            self.model.claim(expected, worker, job.lease_token, job.lease_deadline_us)
        if len(claimed) < limit:
            assert self.model.next_ready(self.clock.now_us()) is None

    @precondition(lambda self: bool(self._live_leases()))
    @rule(
        picks=st.lists(st.integers(min_value=0, max_value=10), min_size=1, max_size=4),
        imposter=st.booleans(),
    )
    def acknowledge_batch(self, picks: list[int], imposter: bool) -> None:
        live = self._live_leases()
        chosen = [live[p % len(live)] for p in picks]
        acks = [
            Acknowledgement(job_id, worker + ("-x" if imposter else ""), token)
            for job_id, worker, token in chosen
        ]
        results = self.queue.succeed_many(acks)
        now = self.clock.now_us()
        for ack, result in zip(acks, results, strict=True):
            reason = self.model.stale_reason(ack.job_id, ack.worker_id, ack.lease_token, now)
            assert result.stale_reason == reason
            if reason is None:
                self.model.succeed(ack.job_id)

    @rule(delta=st.integers(min_value=0, max_value=2_000))
    def advance(self, delta: int) -> None:
        self.clock.advance(delta)

    @rule()
    def recover(self) -> None:
        assert set(self.queue.recover_expired()) == self.model.recover(self.clock.now_us())

    @rule()
    def promote(self) -> None:
        assert set(self.queue.promote_retries()) == self.model.promote(self.clock.now_us())

    @rule(delta=st.integers(min_value=0, max_value=2_000))
    def maintain(self, delta: int) -> None:
        """What a maintenance loop does: let time pass, recover, promote."""
        self.advance(delta)
        self.recover()
        self.promote()

    @invariant()
    def rows_agree_with_the_model(self) -> None:
        for job_id, expected in self.model.jobs.items():
            job = self.queue.get(job_id)
            assert job.state.value == expected.state
            assert job.attempts == expected.attempts
            assert job.lease_token == expected.token
            assert job.lease_deadline_us == expected.deadline
            if expected.state in ("QUEUED", "RETRY_SCHEDULED"):
                assert job.available_at_us == expected.available_at

    @invariant()
    def judges_pass(self) -> None:
        report = check_database(self.path)
        assert report.ok, report.failed()
        replay = replay_database(self.path)
        assert replay.ok, replay.mismatches


QueueAgainstModel.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_queue_agrees_with_the_model = QueueAgainstModel.TestCase
