"""walqueue against an in-memory model, with random restarts and compactions."""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from walqueue import KeyConflict, Lease, Queue, StaleLease

IDS = st.sampled_from(["a", "b", "c", "d", "e"])
PAYLOADS = st.sampled_from([{}, {"v": 1}])


class Model:
    """Reference semantics written from the specification, independent of walqueue.state."""

    def __init__(self) -> None:
        self.tasks: dict[str, dict[str, Any]] = {}

    def put(
        self, task_id: str, payload: dict[str, Any], available_at: int, max_attempts: int
    ) -> str:
        task = self.tasks.get(task_id)
        if task is not None:
            same = (task["payload"], task["original"], task["max_attempts"]) == (
                payload, available_at, max_attempts,
            )  # fmt: skip
            return "existing" if same else "conflict"
        self.tasks[task_id] = {
            "status": "ready", "attempts": 0, "generation": 0, "available_at": available_at,
            "original": available_at, "max_attempts": max_attempts, "payload": payload,
            "owner": None, "deadline": None,
        }  # fmt: skip
        return "created"

    def _end(self, task: dict[str, Any], available_at: int) -> None:
        task["owner"] = task["deadline"] = None
        if task["attempts"] >= task["max_attempts"]:
            task["status"] = "dead"
        else:
            task["status"], task["available_at"] = "ready", available_at

    def reserve(self, worker: str, now: int, lease: int, limit: int) -> list[str]:
        for task in self.tasks.values():
            if task["status"] == "leased" and task["deadline"] <= now:
                self._end(task, task["deadline"])
        ready = sorted(
            (t["available_at"], task_id)
            for task_id, t in self.tasks.items()
            if t["status"] == "ready" and t["available_at"] <= now
        )[:limit]
        for _, task_id in ready:
            task = self.tasks[task_id]
            task.update(status="leased", owner=worker, deadline=now + lease)
            task["attempts"] += 1
            task["generation"] += 1
        return [task_id for _, task_id in ready]

    def live(self, lease: Lease, now: int) -> bool:
        task = self.tasks.get(lease.task_id)
        return bool(
            task and task["status"] == "leased" and task["owner"] == lease.worker
            and task["generation"] == lease.generation and now < task["deadline"]
        )  # fmt: skip


class QueueAgainstModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.temporary = tempfile.TemporaryDirectory()
        self.directory = Path(self.temporary.name) / "q"
        self.queue = Queue(self.directory)
        self.model = Model()
        self.now = 0
        self.leases: list[Lease] = []

    def teardown(self) -> None:
        self.queue.close()
        self.temporary.cleanup()

    @rule(task_id=IDS, payload=PAYLOADS, available_at=st.integers(0, 5), attempts=st.integers(1, 3))
    def put(self, task_id: str, payload: dict[str, Any], available_at: int, attempts: int) -> None:
        expected = self.model.put(task_id, copy.deepcopy(payload), available_at, attempts)
        try:
            self.queue.put(task_id, payload, available_at=available_at, max_attempts=attempts)
            outcome = "ok"
        except KeyConflict:
            outcome = "conflict"
        assert (outcome == "conflict") == (expected == "conflict")

    @rule(worker=st.sampled_from(["w1", "w2"]), lease=st.integers(1, 6), limit=st.integers(1, 3))
    def reserve(self, worker: str, lease: int, limit: int) -> None:
        granted = self.queue.reserve(worker, now=self.now, lease_seconds=lease, limit=limit)
        assert [g.task_id for g in granted] == self.model.reserve(worker, self.now, lease, limit)
        self.leases.extend(granted)

    @precondition(lambda self: bool(self.leases))
    @rule(pick=st.integers(0, 20), release=st.booleans(), delay=st.integers(0, 4))
    def finish(self, pick: int, release: bool, delay: int) -> None:
        lease = self.leases[pick % len(self.leases)]
        live = self.model.live(lease, self.now)
        try:
            if release:
                self.queue.release(lease, now=self.now, delay=delay)
            else:
                self.queue.ack(lease, now=self.now)
            accepted = True
        except StaleLease:
            accepted = False
        assert accepted == live
        if live:
            task = self.model.tasks[lease.task_id]
            if release:
                self.model._end(task, self.now + delay)
            else:
                task.update(status="completed", owner=None, deadline=None)

    @rule(delta=st.integers(0, 4))
    def advance(self, delta: int) -> None:
        self.now += delta

    @rule()
    def restart(self) -> None:
        self.queue.close()
        self.queue = Queue(self.directory)

    @rule()
    def compact(self) -> None:
        assert self.queue.compact() == self.queue.stats()["last_seq"]

    @invariant()
    def agrees_with_the_model(self) -> None:
        assert self.queue.task_ids() == sorted(self.model.tasks)
        for task_id, expected in self.model.tasks.items():
            state = self.queue.get(task_id)
            assert (state.status, state.attempts, state.generation) == (
                expected["status"], expected["attempts"], expected["generation"],
            )  # fmt: skip
            assert (state.lease_owner, state.lease_deadline) == (
                expected["owner"],
                expected["deadline"],
            )
            if state.status == "ready":
                assert state.available_at == expected["available_at"]


QueueAgainstModel.TestCase.settings = settings(
    max_examples=80, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
test_walqueue_agrees_with_the_model = QueueAgainstModel.TestCase
