"""A seeded, model-driven workload: many small operations in a random but reproducible
order, each written to an observation log of what the caller was told.

Where the campaign follows one script per crash point and the probes one race each, this
workload mixes single, batched and (where the system chains them) chained claims and
acknowledgements (single calls now and then carried by a staged writer that commits or
dies), failures, heartbeats,
resubmissions of finished keys, restarts that keep the workers' ids, and clock steps that
land exactly on a lease's deadline, one microsecond before and one after it (the clock is
injected, so "at the deadline" is exact). Nothing here decides what is right: the judge
(``judges/observations.py``) reads the log and the store afterwards.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from crashqueuelab.core.clock import ManualClock
from crashqueuelab.core.ids import SeededIds
from crashqueuelab.judges.findings import (
    Anomaly,
    inconsistent,
    system_raised,
    texts,
    to_json,
)
from crashqueuelab.judges.observations import judge_observations
from crashqueuelab.lab.runs.readings import read_store
from crashqueuelab.lab.runs.records import write_json
from crashqueuelab.lab.runs.systemcalls import SystemRaised, calling
from crashqueuelab.lab.workloads.choices import ChoiceTape
from crashqueuelab.lab.workloads.scenario import LEASE_US, RETRY, START_US
from crashqueuelab.systems.contract import (
    CARRIER_FATES,
    AttemptsClient,
    CarrierStaging,
    ChainingClient,
    Claim,
    JobSpec,
    OpenRequest,
    QueueClient,
    System,
)

OBSERVATIONS_FILE = "observations.jsonl"
#: The run's every choice as data (``ChoiceTape`` blocks): replaying it makes the same run.
SCHEDULE_FILE = "schedule.json"
STORE_DIRECTORY = "store"
STEPS = 400
WORKERS = ("worker-a", "worker-b", "worker-c")
JOBS = 16
#: The share of single calls made behind a staged carrier, where the system can stage one.
CARRIED_SHARE = 0.2
T = TypeVar("T")


@dataclass
class _Run:
    system: System
    directory: Path
    rng: ChoiceTape
    clock: ManualClock = field(default_factory=lambda: ManualClock(START_US))
    client: QueueClient | None = None
    opened: int = 0
    specs: list[JobSpec] = field(default_factory=list)
    #: Every claim each worker was given, live or not: fencing is tested with old ones too.
    claims: dict[str, list[Claim]] = field(default_factory=dict)
    deadlines: list[int] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def open(self) -> QueueClient:
        self.opened += 1
        ids = SeededIds(self.rng.randrange(2**32), f"model/{self.opened}")
        request = OpenRequest(self.directory / STORE_DIRECTORY, self.clock, ids, RETRY)
        with calling(self.system.name, "open"):
            self.client = self.system.open(request)
        return self.client

    def log(self, op: str, **fields: Any) -> None:
        self.lines.append(json.dumps({"op": op, "t": self.clock.now_us(), **fields}))


def _claimed(run: _Run, worker: str, claims: list[Claim], *, batch: bool) -> None:
    for claim in claims:
        run.claims.setdefault(worker, []).append(claim)
        run.deadlines.append(run.clock.now_us() + LEASE_US)
        run.log("claim", worker=worker, key=claim.key, token=claim.token, attempt=claim.attempt,
                deadline=run.clock.now_us() + LEASE_US, batch=batch)  # fmt: skip


def _step(run: _Run, client: QueueClient) -> None:
    rng, worker = run.rng, run.rng.choice(WORKERS)
    held = run.claims.get(worker, [])
    roll = rng.random()
    if roll < 0.12 or not run.specs:
        index = rng.randrange(JOBS)
        spec = JobSpec(f"model-{index:02d}", "model", {"n": index}, max_attempts=1 + index % 3)
        run.specs.append(spec)
        run.log("submit", key=spec.key, job_id=client.submit(spec), max_attempts=spec.max_attempts)
    elif roll < 0.30:
        claim = _single(run, client, functools.partial(client.claim, worker, LEASE_US))
        _claimed(run, worker, [] if claim is None else [claim], batch=False)
    elif roll < 0.38:
        _claimed(run, worker, client.claim_many(worker, LEASE_US, rng.randint(2, 3)), batch=True)
    elif roll < 0.52 and held:
        claim = rng.choice(held[-4:])
        chaining = _chaining(run, client)
        if chaining is not None and rng.random() < 0.5:
            verdict, chained = _single(
                run, client, functools.partial(chaining.succeed_and_claim, claim, LEASE_US)
            )
            run.log("ack", worker=worker, key=claim.key, token=claim.token,
                    verdict=verdict.value, batch=False, chained=True)  # fmt: skip
            _claimed(run, worker, [] if chained is None else [chained], batch=False)
        else:
            verdict = _single(run, client, functools.partial(client.succeed, claim))
            run.log("ack", worker=worker, key=claim.key, token=claim.token,
                    verdict=verdict.value, batch=False)  # fmt: skip
    elif roll < 0.58 and len(held) >= 2:
        batch = rng.sample(held[-4:], min(2, len(held[-4:])))
        chaining = _chaining(run, client)
        following: list[Claim] = []
        if chaining is not None and rng.random() < 0.5:
            verdicts, following = chaining.succeed_many_and_claim(
                batch, worker, LEASE_US, rng.randint(1, 2)
            )
        else:
            verdicts = client.succeed_many(batch)
        for claim, verdict in zip(batch, verdicts, strict=True):
            run.log("ack", worker=worker, key=claim.key, token=claim.token,
                    verdict=verdict.value, batch=True)  # fmt: skip
        _claimed(run, worker, following, batch=True)
    elif roll < 0.64 and held:
        claim = rng.choice(held[-4:])
        run.log("fail", worker=worker, key=claim.key, token=claim.token,
                verdict=client.fail(claim, "model failure").value)  # fmt: skip
    elif roll < 0.68 and held and run.system.capabilities.heartbeats:
        claim = held[-1]
        # Now and then a heartbeat shortens the lease: the deadline is now plus the lease.
        lease = rng.choice((LEASE_US, LEASE_US, LEASE_US // 10))
        ok = client.heartbeat(claim, lease)
        run.log("heartbeat", worker=worker, key=claim.key, token=claim.token, ok=ok,
                deadline=run.clock.now_us() + lease)  # fmt: skip
        _report_read(run, client, claim.key, final=False)  # where the deadline now stands
    elif roll < 0.84:
        _advance(run)
    elif roll < 0.95:
        run.log("recover", moved=client.recover())
    else:
        client.close()
        run.log("restart")
        _report_reads(run, run.open(), final=False)


def _report_reads(run: _Run, client: QueueClient, *, final: bool) -> None:
    """What the system reports about every job submitted so far, and how many are
    unfinished: the judge compares it with what the callers were told (and, at the end,
    with the store)."""
    for key in sorted({spec.key for spec in run.specs}):
        _report_read(run, client, key, final=final)
    run.log("count", final=final, active=client.active_count())


def _report_read(run: _Run, client: QueueClient, key: str, *, final: bool) -> None:
    view = client.job(key)
    attempts = client.attempts(key) if isinstance(client, AttemptsClient) else None
    run.log(
        "read",
        key=key,
        final=final,
        view=None if view is None else {"status": view.status.value, "attempts": view.attempts},
        attempts=None if attempts is None else [one.to_json() for one in attempts],
    )


def _single(run: _Run, client: QueueClient, call: Callable[[], T]) -> T:
    """Make a single call; where the system lets the lab stage it, now and then while
    another writer carries it and commits or dies (``CarrierStaging``)."""
    staging = client if isinstance(client, CarrierStaging) else None
    if run.system.capabilities.carried and staging and run.rng.random() < CARRIED_SHARE:
        fate = run.rng.choice(CARRIER_FATES)
        run.log("carried", fate=fate)
        answer: T = staging.behind_a_carrier(call, fate)
        return answer
    return call()


def _chaining(run: _Run, client: QueueClient) -> ChainingClient | None:
    """The client's chained calls, where the system declares them."""
    if run.system.capabilities.chained and isinstance(client, ChainingClient):
        return client
    return None


def _advance(run: _Run) -> None:
    """Step the clock: a little, to a lease's deadline (or one microsecond either side of
    it), or past every lease and retry."""
    now, rng = run.clock.now_us(), run.rng
    ahead = [deadline for deadline in run.deadlines if deadline > now]
    choice = rng.random()
    if ahead and choice < 0.6:
        target = rng.choice(ahead) + rng.choice((-1, 0, 0, 1))
        run.clock.advance(max(1, target - now))
    elif choice < 0.85:
        run.clock.advance(rng.randint(1, LEASE_US // 5))
    else:
        run.clock.advance(LEASE_US + RETRY.max_delay_us)
    run.log("clock")


def schedule_of(seed: int, blocks: list[list[int]]) -> dict[str, Any]:
    """A model workload's schedule: its seed and its choices, block 0 opening the store and
    one block per operation after it."""
    return {"seed": seed, "operations": len(blocks) - 1, "choices": blocks}


def run_model_workload(
    system: System,
    directory: Path,
    *,
    seed: int,
    steps: int = STEPS,
    schedule: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Drive ``steps`` seeded operations (or replay a ``schedule``: its seed and choices),
    then judge the observation log against the store."""
    if schedule is not None:
        seed, blocks = schedule["seed"], schedule["choices"]
        steps, rng = len(blocks) - 1, ChoiceTape(seed, blocks)
    else:
        rng = ChoiceTape(seed)
    run = _Run(system, directory, rng)
    directory.mkdir(parents=True)
    error: Anomaly | None = None
    try:
        run.open()
        for _ in range(steps):
            assert run.client is not None
            rng.next_block()
            _step(run, run.client)
        assert run.client is not None
        _report_reads(run, run.client, final=True)
    except SystemRaised as failure:
        error = failure.finding()
        run.log("raised", error=error.text)
    except Exception as failure:  # the system raised on a valid operation: that is evidence
        error = system_raised(failure)
        run.log("raised", error=error.text)
    finally:
        if run.client is not None:
            run.client.close()
    log = directory / OBSERVATIONS_FILE
    log.write_text("\n".join(run.lines) + "\n", encoding="utf-8")
    write_json(directory / SCHEDULE_FILE, schedule_of(seed, rng.used))
    keys = sorted({spec.key for spec in run.specs})
    reading = read_store(system, directory / STORE_DIRECTORY, keys)
    verdict = judge_observations(
        log,
        {key: job.status.value for key, job in reading.jobs.items()},
        {key: job.attempts for key, job in reading.jobs.items()},
    )
    findings = ([error] if error else []) + verdict.findings
    findings += [inconsistent(problem, "judge: ") for problem in reading.problems]
    anomalies = texts(findings)
    report = {
        "seed": seed,
        "steps": steps,
        "observations": len(run.lines),
        "restarts": run.opened - 1,
        "carrier_deaths": sum('"op": "carried"' in line and "dies" in line for line in run.lines),
        "checked": verdict.checked,
        "anomalies": anomalies,
        "findings": to_json(findings),
        "ok": not anomalies,
        "observation_log": OBSERVATIONS_FILE,
        # What the system's independent reader found at the end, key by key.
        "store": {
            key: {"status": job.status.value, "attempts": job.attempts}
            for key, job in sorted(reading.jobs.items())
        },
        "schedule": SCHEDULE_FILE,
    }
    write_json(directory / "model.json", report)
    return report
