"""The two kinds of process a chaos run starts: workers (which get killed) and maintenance.

Both open the system under test after they start; nothing crosses a fork. A system with a
single owner gets one worker, the owner, which also does its own maintenance. Every worker
writes what it was told to its log (``worklog.py``).

A worker's shutdown is the lab's documented one (``lab/workloads/shutdown.py``): at SIGTERM
it finishes the batch in hand (its effects and its acknowledgement), claims nothing more
and exits 0; a second SIGTERM changes nothing. SIGINT stays ignored (the supervisor's).
In a run with deploys each worker leads a session of its own, so the SIGKILL at the end of
a grace period reaches every process it started and nothing else of the run.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from crashqueuelab.core.clock import SystemClock
from crashqueuelab.core.errors import OutcomeUnknown
from crashqueuelab.core.ids import RandomIds
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.lab.chaos.longjobs import work_long
from crashqueuelab.lab.chaos.poison import DIE, behaviour
from crashqueuelab.lab.chaos.worklog import SHARED_COMMIT_COUNTS, lease_line
from crashqueuelab.lab.runs.inheritance import Inherited
from crashqueuelab.lab.runs.interrupts import ignore_interrupts
from crashqueuelab.lab.workloads.effects import Destination, EffectLedger
from crashqueuelab.lab.workloads.shutdown import stop_on
from crashqueuelab.systems.contract import (
    Claim,
    CommitSharingClient,
    OpenRequest,
    QueueClient,
    Verdict,
)
from crashqueuelab.systems.registry import resolve_system

#: How long an idle worker or the maintenance loop waits before looking again.
POLL_S = 0.005
#: Retries come back quickly in a chaos run: leases are short and kills are frequent.
CHAOS_RETRY = RetryPolicy(base_delay_us=10_000, max_delay_us=200_000)
#: How often an owner that does its own maintenance looks for expired leases.
OWNER_RECOVERY_EVERY_S = 0.02
#: The exit status of a worker whose system raised; the error is kept beside its log.
WORKER_FAILED = 3
ERROR_SUFFIX = ".error"


@dataclass(frozen=True)
class RunFiles:
    """Where a chaos run keeps the store and the two ledgers."""

    store: str
    effects: str
    executions: str


@dataclass(frozen=True)
class WorkerSpec:
    system: str
    files: RunFiles
    worker_id: str
    lease_us: int
    batch: int
    log: str
    does_maintenance: bool
    #: Written by the supervisor once every planned fault has landed: until then a worker
    #: that finds no work waits instead of exiting, so the work cannot end under the faults.
    release_file: str
    #: The parent's import path and server environment (a fork server started earlier may
    #: have neither).
    inherited: Inherited
    #: Lead a session of its own (a run with deploys SIGKILLs a worker's whole session).
    own_session: bool = False


def _guarded(error_file: str, inherited: Inherited, body: Callable[[], None]) -> None:
    """Run ``body``; if the system raises, keep the traceback and exit with WORKER_FAILED."""
    ignore_interrupts()
    inherited.adopt()
    try:
        body()
    except Exception:
        Path(error_file).write_text(traceback.format_exc())
        sys.exit(WORKER_FAILED)


def open_client(system: str, store: str) -> QueueClient:
    request = OpenRequest(Path(store), SystemClock(), RandomIds(), CHAOS_RETRY)
    return resolve_system(system).open(request)


def _answer(verdict: Verdict) -> str:
    return "stale" if verdict is Verdict.STALE else "ack"


def worker_main(spec: WorkerSpec) -> None:
    """Claim a batch, execute each job against both ledgers, acknowledge; until no work is left.

    Every execution is written to the non-idempotent ledger (one row per execution) and to
    the idempotent one (one effect per job however often it runs).
    """
    _guarded(spec.log + ERROR_SUFFIX, spec.inherited, lambda: _work(spec))


def _claim(client: QueueClient, spec: WorkerSpec) -> list[Claim]:
    # A batch of one goes through the single calls, which other workers' commits can carry
    # (group commit), so the signals also land on carriers and the writers they carry.
    if spec.batch == 1:
        claim = client.claim(spec.worker_id, spec.lease_us)
        return [] if claim is None else [claim]
    return client.claim_many(spec.worker_id, spec.lease_us, spec.batch)


def _succeed(client: QueueClient, spec: WorkerSpec, claims: list[Claim]) -> list[Verdict]:
    if spec.batch == 1:
        return [client.succeed(claim) for claim in claims]
    return client.succeed_many(claims)


def _handle_poison(client: QueueClient, claims: list[Claim], log: TextIO) -> list[Claim]:
    """End each poison job's attempt as its handler would (poison.py); the other claims.

    A dying handler takes its worker down at once, as a crash would; a failing one reports
    the failure, after an ``acking`` line (the lease may end from then on)."""
    normal = []
    for claim in claims:
        ending = behaviour(claim.payload)
        if ending is None:
            normal.append(claim)
        elif ending == DIE:
            log.write(lease_line("poisoned", claim.key, claim.token, time.monotonic()))
            log.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        else:
            log.write(lease_line("acking", claim.key, claim.token, time.monotonic()))
            verdict = client.fail(claim, "poisoned: every attempt of this job fails")
            failed = f"failed-{verdict.value}"
            log.write(lease_line(failed, claim.key, claim.token, time.monotonic()))
    return normal


class _SharedCommitsLog:
    """Writes a ``commits`` line (worklog.py) whenever the client's group-commit counts
    moved, with how much; a client that does not share commits writes none."""

    def __init__(self, client: QueueClient, log: TextIO) -> None:
        self._client = client if isinstance(client, CommitSharingClient) else None
        self._log = log
        self._last = dict.fromkeys(SHARED_COMMIT_COUNTS, 0)
        if self._client is not None:
            # Zeros first: the report then knows the system shares commits, even if none was.
            self._write(self._last)

    def note(self) -> None:
        if self._client is None:
            return
        counts = self._client.shared_commits()
        moved = {name: counts[name] - self._last[name] for name in SHARED_COMMIT_COUNTS}
        if any(moved.values()):
            self._last = {name: counts[name] for name in SHARED_COMMIT_COUNTS}
            self._write(moved)

    def _write(self, counts: dict[str, int]) -> None:
        values = " ".join(str(counts[name]) for name in SHARED_COMMIT_COUNTS)
        self._log.write(f"commits {values} {time.monotonic():.6f}\n")


def _work(spec: WorkerSpec) -> None:
    if spec.own_session:
        os.setsid()
    stop = stop_on(signal.SIGTERM)
    client = open_client(spec.system, spec.files.store)
    effects = EffectLedger(spec.files.effects, destination=Destination.IDEMPOTENT, create=False)
    executions = EffectLedger(
        spec.files.executions, destination=Destination.NON_IDEMPOTENT, create=False
    )
    next_recovery = 0.0
    idle = False
    try:
        with effects, executions, Path(spec.log).open("a", buffering=1) as log:
            shared = _SharedCommitsLog(client, log)
            polling = False
            while not stop.is_set():
                if spec.does_maintenance and time.monotonic() >= next_recovery:
                    client.recover()
                    next_recovery = time.monotonic() + OWNER_RECOVERY_EVERY_S
                asked = time.monotonic()
                if not polling:
                    # A claim call's start, said once per run of empty polls: a worker
                    # stopped inside one may take a job with it that it never logged.
                    log.write(f"claiming {asked:.6f}\n")
                claims = _claim(client, spec)
                polling = not claims
                shared.note()
                if not claims:
                    if client.active_count() == 0:
                        if Path(spec.release_file).exists():
                            return
                        if not idle:
                            # Faults are still planned at marks the work may never reach
                            # (a power cut lost acknowledged jobs): the supervisor decides.
                            idle = True
                            log.write(f"idle {time.monotonic():.6f}\n")
                    stop.wait(POLL_S)
                    continue
                for claim in claims:
                    got = time.monotonic()
                    log.write(lease_line("claim", claim.key, claim.token, got, asked))
                # A poison job's handler dies or fails before any effect.
                claims = _handle_poison(client, claims, log)
                claims = work_long(client, claims, spec.lease_us / 1_000_000, log)
                if not claims:
                    continue
                for claim in claims:
                    for ledger in (executions, effects):
                        ledger.apply(
                            effect_key=claim.payload["effect_key"],
                            value=claim.payload["value"],
                            job_id=claim.job_id,
                            attempt=claim.attempt,
                            worker_id=spec.worker_id,
                        )
                for claim in claims:
                    log.write(lease_line("acking", claim.key, claim.token, time.monotonic()))
                try:
                    verdicts = _succeed(client, spec, claims)
                except OutcomeUnknown:
                    # The answer was lost and the server could not be asked: the ``acking``
                    # lines stand with no answer, counted unknown and settled by the store.
                    continue
                answered = time.monotonic()
                shared.note()
                for claim, verdict in zip(claims, verdicts, strict=True):
                    log.write(lease_line(_answer(verdict), claim.key, claim.token, answered))
    finally:
        client.close()


def maintenance_main(
    system: str, store: str, stop_file: str, release_file: str, inherited: Inherited
) -> None:
    """Recover expired leases and release due retries until no work is left or told to stop."""
    _guarded(
        stop_file + ERROR_SUFFIX,
        inherited,
        lambda: _maintain(system, store, stop_file, release_file),
    )


def _maintain(system: str, store: str, stop_file: str, release_file: str) -> None:
    client = open_client(system, store)
    try:
        while not Path(stop_file).exists():
            client.recover()
            if client.active_count() == 0 and Path(release_file).exists():
                return
            time.sleep(POLL_S * 4)
    finally:
        client.close()
