"""Disk faults: each transition of a small workload made while the disk answers errors.

For each step of the workload (submit, claim, succeed, submit, claim, fail, and a reopen:
the store opened and recovered again) a case of its own: the store is on a fresh
power-loss disk (``lab/faults/powerloss``), the steps before
run on a healthy disk, then the fault is armed, the step's call is made, and the fault is
disarmed. What the caller was told is recorded (a value, or the exception). Then the disk
has recovered: the client is closed and a fresh one opened, as a restarted worker would
(a refusal to open is recorded and said), which resubmits both jobs (idempotent keys) and
works until nothing is left, every answer recorded too. Then the power is cut.

The store is read twice with the system's independent reader (``System.reader``): as the
recovered disk shows it before the cut (``live``: the page cache, which still holds what a
failed fsync dropped), and as the disk holds it after the cut (``after_cut``: every
unsynced write lost, and every write a failed fsync covered: fsyncgate). Each reading is
judged against what the callers were told: a job whose submission was acknowledged must
exist, a claim acknowledged at attempt n must have made at least n attempts, an
acknowledged success or death must be there as such (never run again). A transition the
caller was told failed may or may not be there: fine. A case whose fault never fired (the
step never reached the operation the fault covers) is ``not exercised``, never passed. A
case with findings is run again on a healthy disk (a fault that matches no path): findings
that run gives too, cut right before the step or recovered after it, are the system's own
weakness and set apart (``fails-without-the-fault``), never counted as the fault's.

Run: ``crashqueuelab disk-faults --system walqueue --disk-fault eio-fsync
--output-directory D`` (``--disk-fault all``: every fault; docs/power-loss.md#disk-faults).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crashqueuelab.core.clock import ManualClock
from crashqueuelab.core.errors import CrashModeUnavailable, InvalidInput
from crashqueuelab.core.ids import SeededIds
from crashqueuelab.core.retry import RetryPolicy
from crashqueuelab.judges.findings import Anomaly, texts, to_json
from crashqueuelab.lab.campaign.diskfault_told import (
    JOBS,
    Told,
    judge,
    obligations,
)
from crashqueuelab.lab.faults.powerloss.crashstate import LOSE_ALL, DistinctStates
from crashqueuelab.lab.faults.powerloss.disk import PowerLossDisk, require_power_loss
from crashqueuelab.lab.faults.powerloss.faults import DISK_FAULTS, DiskFault
from crashqueuelab.lab.faults.powerloss.redisdisk import RedisOnDisk
from crashqueuelab.lab.faults.powerloss.serverdisk import ClusterTemplate, ServerOnDisk
from crashqueuelab.lab.faults.powerloss.targets import StoreOnDisk
from crashqueuelab.lab.runs import kinds
from crashqueuelab.lab.runs.commands import import_path
from crashqueuelab.lab.runs.interrupts import Interrupted
from crashqueuelab.lab.runs.modes import POWER_LOSS
from crashqueuelab.lab.runs.progress import Progress, labelled
from crashqueuelab.lab.runs.promises import classify
from crashqueuelab.lab.runs.readings import read_store
from crashqueuelab.lab.runs.records import prepare_output_directory, write_json
from crashqueuelab.lab.workloads.scenario import STORE_DIRECTORY
from crashqueuelab.servers.base import Throwaway
from crashqueuelab.systems.contract import (
    Claim,
    JobSpec,
    OpenRequest,
    QueueClient,
    StoreReading,
    System,
    Verdict,
)

RECORD_FILE = kinds.DISK_FAULTS.record
#: What ``--disk-fault`` takes for every fault of ``DISK_FAULTS``.
ALL = "all"
LEASE_US = 5_000_000
RETRY = RetryPolicy(base_delay_us=1_000, max_delay_us=8_000)
#: The steps of the workload, each a case with the fault armed around its call. The
#: checkpoint (walqueue's compaction: a new segment, a snapshot and CURRENT renamed in, old
#: segments deleted, each followed by a sync of the directory) only for a system whose
#: checkpoint does durable work (``Capabilities.checkpoint``).
STEPS = (
    "submit-a",
    "claim-a",
    "succeed-a",
    "submit-b",
    "claim-b",
    "fail-b",
    "reopen",
    "checkpoint",
)
CHECKPOINT = STEPS.index("checkpoint")
#: A bound on the work after recovery: every job claimed and finished in this many rounds.
FINISH_ROUNDS = 12
#: Verdicts of a case.
PASSED, FAILED, NOT_EXERCISED = "passed", "failed", "not-exercised"
#: A case whose findings the same workload gives on a healthy disk: the system's own.
WITHOUT_THE_FAULT = "fails-without-the-fault"
#: Where the healthy-disk runs of a case go, and the path its never-firing fault names.
CONTROL_PREFIX = "healthy-disk-"
CONTROL_PATH = "\x00matches-nothing"
#: How long a server the fault brought down may take to answer again by itself (PostgreSQL's
#: postmaster restarts after a PANIC) before it is started again.
SERVER_BACK_S = 30.0


def _shown(value: Any) -> Any:
    if isinstance(value, Claim):
        return {"claim": value.key, "attempt": value.attempt}
    if isinstance(value, Verdict):
        return value.value
    return value


class _Driver:
    """Makes the workload's calls on one client, remembering every answer and claim."""

    def __init__(self, system: System, store: Path, clock: ManualClock, seed: int) -> None:
        self.system = system
        self.store = store
        self.clock = clock
        self.seed = seed
        self.opened = 0
        self.told: list[Told] = []
        self.claims: dict[str, Claim] = {}
        self.client: QueueClient | None = None

    def open(self) -> None:
        self.opened += 1
        ids = SeededIds(self.seed, f"disk-faults-{self.opened}")
        self.client = self.system.open(OpenRequest(self.store, self.clock, ids, RETRY))

    def close(self) -> str | None:
        client, self.client = self.client, None
        try:
            if client is not None:
                client.close()
        except Exception as error:  # a close on a failed disk may fail: evidence
            return f"{type(error).__name__}: {error}"
        return None

    def call(self, step: str, faulted: bool, make: Callable[[QueueClient], Any]) -> Told:
        assert self.client is not None
        told = Told(step, faulted)
        try:
            value = make(self.client)
            if isinstance(value, Claim):
                self.claims[value.key] = value
            told.value = _shown(value)
        except Exception as error:  # what the system raised is what its caller was told
            told.error = f"{type(error).__name__}: {error}"
        self.told.append(told)
        return told

    def step(self, step: str, faulted: bool) -> Told | None:
        """One step of ``STEPS``; None when an earlier answer left nothing to do."""
        if step == "reopen":  # a restart: the store opened (and recovered) again
            told = Told(step, faulted)
            self.close()
            try:
                self.open()
            except Exception as error:
                told.error = f"{type(error).__name__}: {error}"
            self.told.append(told)
            return told
        if step == "checkpoint":
            return self.call(step, faulted, lambda client: client.checkpoint())
        job = JOBS[0] if step.endswith("-a") else JOBS[1]
        if step.startswith("submit"):
            return self.call(step, faulted, lambda client: client.submit(job))
        if step.startswith("claim"):
            return self.call(step, faulted, lambda client: client.claim("worker", LEASE_US))
        claim = self.claims.get(job.key)
        if claim is None:
            return None
        if step.startswith("succeed"):
            return self.call(step, faulted, lambda client: client.succeed(claim))
        return self.call(step, faulted, lambda client: client.fail(claim, "the handler failed"))

    def finish(self) -> None:
        """After recovery: both jobs resubmitted, then worked until none is left."""
        self.clock.advance(LEASE_US * 2 + RETRY.max_delay_us)
        self.call("recover", False, lambda client: client.recover())
        for job in JOBS:
            self.call(f"resubmit-{job.key}", False, _submitting(job))
        for _ in range(FINISH_ROUNDS):
            self.clock.advance(RETRY.max_delay_us)
            claimed = self.call("finish-claim", False, lambda c: c.claim("restarted", LEASE_US))
            if not claimed.ok or claimed.value is None:
                break
            claim = self.claims[claimed.value["claim"]]
            self.call(f"finish-succeed-{claim.key}", False, _succeeding(claim))


def _succeeding(claim: Claim) -> Callable[[QueueClient], Any]:
    return lambda client: client.succeed(claim)


def _submitting(job: JobSpec) -> Callable[[QueueClient], Any]:
    return lambda client: client.submit(job)


def _faulted_step(
    disk: PowerLossDisk, driver: _Driver, fault: DiskFault, step_index: int
) -> tuple[Told | None, int]:
    """The steps before on a healthy disk, then the step under ``fault``; what the step was
    told, and how many errors the disk answered."""
    driver.open()
    for earlier in STEPS[:step_index]:
        driver.step(earlier, False)
    disk.arm(fault, arming=STEPS[step_index])
    try:
        faulted = driver.step(STEPS[step_index], True)
    finally:
        disk.disarm()
    return faulted, len(disk.fired())


@dataclass(frozen=True)
class _Run:
    """What every case of a run shares: the system, the seed, and for a system on a
    PostgreSQL server the cluster each case's server starts from."""

    system: System
    seed: int
    template: ClusterTemplate | None = None


class _Site:
    """Where one case keeps its data on a power-loss disk: the store directory itself, or
    (a system on a server) the data directory of a server of its own."""

    def __init__(self, run: _Run, where: Path) -> None:
        self.run = run
        self.where = where
        self.target: StoreOnDisk | ServerOnDisk | RedisOnDisk
        if run.system.server == "redis":
            self.target = RedisOnDisk(where, run.system.persistence or "rdb")
        elif run.template is not None:
            self.target = ServerOnDisk(where, run.template)
        else:
            self.target = StoreOnDisk(where)

    @property
    def disk(self) -> PowerLossDisk:
        return self.target.disk

    @property
    def store(self) -> Path:
        return self.where / STORE_DIRECTORY

    def read(self) -> StoreReading:
        return read_store(self.run.system, self.store, [job.key for job in JOBS])

    def server_back(self) -> dict[str, Any]:
        """A server the fault brought down (PostgreSQL PANICs on a failed fsync; Redis exits
        when it cannot sync its append-only file under ``appendfsync always``) is started
        again on its disk, as its supervisor would: what it does then is its own
        recovery."""
        if isinstance(self.target, RedisOnDisk):
            redis = self.target.server
            if redis.running:
                return {"server": "answering"}
            return _started_again(redis, f"exited: {redis.last_words()}")
        if not isinstance(self.target, ServerOnDisk):
            return {}
        server = self.target.server
        deadline = time.monotonic() + SERVER_BACK_S
        while server.processes() and time.monotonic() < deadline:
            if _accepts(server.dsn):
                return {"server": "answering"}
            time.sleep(0.5)
        return _started_again(server, "its postmaster gave up")

    def cut_and_read(self) -> tuple[StoreReading, int, int]:
        """The power cut: every unsynced write lost, and every write a failed fsync
        dropped; the crash state read (a server's: by a server started on it)."""
        journal = self.target.cut()
        state_dir = self.where / "after-cut"
        state_dir.mkdir()
        with self.target.place(journal, LOSE_ALL, state_dir, DistinctStates(journal)) as placed:
            if placed.problem is not None:
                reading = StoreReading(
                    exists=True, jobs={}, facts={}, ok=False, problems=[placed.problem],
                    judge="the server started on the crash state",
                )  # fmt: skip
            else:
                reading = read_store(
                    self.run.system, state_dir / STORE_DIRECTORY, [job.key for job in JOBS]
                )
        return reading, len(journal.failed), journal.failed_syncs


def _started_again(server: Throwaway, why: str) -> dict[str, Any]:
    try:
        server.kill()  # what is left of it (nothing, once it gave up)
        server.start_again()
    except Exception as error:  # a server that will not start again is evidence
        return {"server": f"did not start again: {type(error).__name__}: {error}", "why": why}
    return {"server": "started again", "why": why}


def _accepts(dsn: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=2) as connection:
            connection.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def _at_once(
    run: _Run, fault: DiskFault, step_index: int, case_dir: Path, name: str = ""
) -> dict[str, Any]:
    """The power goes right after the faulted call, the client still open: nothing the
    system does later (a close, a reopen) may make good what it was told."""
    site = _Site(run, case_dir / f"{name}cut-at-once")
    driver = _Driver(run.system, site.store, ManualClock(1_000_000), run.seed)
    try:
        with site.target:
            faulted, fired = _faulted_step(site.disk, driver, fault, step_index)
            reading, dropped, failed_syncs = site.cut_and_read()
    finally:
        driver.close()  # on a mount that is gone: closes handles on nothing
    findings = judge(reading, obligations(driver.told), "cut at once")
    return {
        "faulted": faulted,
        "fired": fired,
        "report": {
            "calls": [answer.to_json() for answer in driver.told],
            "after_cut": reading.to_json(),
            "writes_dropped_by_failed_fsync": dropped,
            "failed_fsyncs": failed_syncs,
        },
        "findings": findings,
    }


def _recovered(
    run: _Run, fault: DiskFault, step_index: int, case_dir: Path, name: str = ""
) -> dict[str, Any]:
    """The disk recovers: a fresh client opens the store, resubmits and finishes the work;
    the store is read as the page cache shows it, then the power goes and it is read again."""
    site = _Site(run, case_dir / f"{name}recovered")
    driver = _Driver(run.system, site.store, ManualClock(1_000_000), run.seed)
    reopen: dict[str, Any] = {}
    try:
        with site.target:
            faulted, fired = _faulted_step(site.disk, driver, fault, step_index)
            closed = driver.close()
            reopen.update(site.server_back())
            try:
                driver.open()
                reopen["opened"] = True
            except Exception as error:  # a refusal to open is said, not a crash of the lab
                reopen.update(opened=False, refused=f"{type(error).__name__}: {error}")
            if driver.client is not None:
                driver.finish()
            driver.close()
            live = site.read()
            reading, dropped, failed_syncs = site.cut_and_read()
    finally:
        driver.close()
    promised = obligations(driver.told)
    findings = judge(live, promised, "recovered") + judge(reading, promised, "recovered, cut")
    return {
        "faulted": faulted,
        "fired": fired,
        "report": {
            "close_after_fault": closed,
            "reopen": reopen,
            "calls": [answer.to_json() for answer in driver.told],
            "promised": {key: [str(s), n] for key, (s, n) in sorted(promised.items())},
            "live": live.to_json(),
            "after_cut": reading.to_json(),
            "writes_dropped_by_failed_fsync": dropped,
            "failed_fsyncs": failed_syncs,
        },
        "findings": findings,
    }


def _without_the_fault(run: _Run, fault: DiskFault, step_index: int, case_dir: Path) -> set[str]:
    """The findings the same workload gives on a healthy disk: cut right before the step
    (what was acknowledged before the fault), and recovered after the step. A finding also
    found here is the system's own, not the fault's (huey's dequeue, for one)."""
    never = DiskFault(fault.operation, fault.error, CONTROL_PATH)
    found = _recovered(run, never, step_index, case_dir, CONTROL_PREFIX)["findings"]
    if step_index > 0:
        before = _at_once(run, never, step_index - 1, case_dir, CONTROL_PREFIX)
        found += before["findings"]
    return {finding.text for finding in found}


def run_case(
    run: _Run, fault: DiskFault, step_index: int, case_dir: Path, output_dir: Path
) -> tuple[dict[str, Any], list[Anomaly]]:
    """One step made under ``fault``, twice: the power cut at once, and the disk recovered
    (the work finished by a restarted client) then cut. A case with findings runs again on
    a healthy disk, and the findings that healthy run gives too are set apart. The case's
    record, and the findings that are the fault's."""
    at_once = _at_once(run, fault, step_index, case_dir)
    recovered = _recovered(run, fault, step_index, case_dir)
    faulted: Told | None = recovered["faulted"]
    findings = [*at_once["findings"], *recovered["findings"]]
    healthy = _without_the_fault(run, fault, step_index, case_dir) if findings else set()
    own = [finding for finding in findings if finding.text in healthy]
    due = [finding for finding in findings if finding.text not in healthy]
    exercised = at_once["fired"] and recovered["fired"] and faulted is not None
    verdict = (
        FAILED if due else WITHOUT_THE_FAULT if own else PASSED if exercised else NOT_EXERCISED
    )
    where = case_dir.relative_to(output_dir)
    report = {
        "step": STEPS[step_index],
        "fault": fault.to_json(),
        "directory": str(where),
        "errors_answered": recovered["fired"],
        "told": faulted.to_json() if faulted is not None else None,
        "reopen": recovered["report"]["reopen"],
        "cut_at_once": at_once["report"],
        "recovered": recovered["report"],
        "anomalies": texts(due),
        "findings": to_json(due),
        "found_without_the_fault": texts(own),
        "verdict": verdict,
        "artifacts": {
            "cut_at_once": str(where / "cut-at-once"),
            "recovered": str(where / "recovered"),
            **(
                {
                    f"healthy_disk_{kind}": str(where / f"{CONTROL_PREFIX}{part}")
                    for kind, part in (("cut", "cut-at-once"), ("recovered", "recovered"))
                }
                if findings
                else {}
            ),
        },
    }
    write_json(case_dir / "case.json", report)
    return report, due


def fault_names(asked: Sequence[str]) -> list[str]:
    """The faults a run makes, each once, in the order asked: ``all`` is every one."""
    names: list[str] = []
    for name in asked:
        for one in DISK_FAULTS if name == ALL else (name,):
            if one not in DISK_FAULTS:
                known = ", ".join([*DISK_FAULTS, ALL])
                raise InvalidInput("disk_fault", f"{one!r} is not one of {known}")
            if one not in names:
                names.append(one)
    if not names:
        raise InvalidInput("disk_fault", f"name one at least: {', '.join([*DISK_FAULTS, ALL])}")
    return names


def _case_line(fault_name: str, step: str, line: str) -> str:
    return f"{fault_name} {step}: {line}"


def summarize(cases: Sequence[dict[str, Any]]) -> dict[str, int]:
    verdicts = [case["verdict"] for case in cases]
    return {
        "cases": len(cases),
        "passed": verdicts.count(PASSED),
        "failed": verdicts.count(FAILED),
        "not_exercised": verdicts.count(NOT_EXERCISED),
        "fails_without_the_fault": verdicts.count(WITHOUT_THE_FAULT),
        "told_failure": sum(1 for c in cases if c["told"] and "error" in c["told"]),
        "told_success": sum(1 for c in cases if c["told"] and "error" not in c["told"]),
        "refused_to_open": sum(1 for c in cases if not c["reopen"].get("opened")),
    }


def headline(summary: dict[str, int], faults: Sequence[str]) -> str:
    """The run in one sentence: how many fault x step cases passed, and what else."""
    text = f"{summary['passed']} of {summary['cases']} cases passed ({', '.join(faults)})"
    others = [
        f"{summary[key]} {said}"
        for key, said in (
            ("failed", "failed"),
            ("fails_without_the_fault", "fail without the fault too"),
            ("not_exercised", "not exercised"),
        )
        if summary[key]
    ]
    return text + (f"; {', '.join(others)}" if others else "")


def applicable_steps(system: System) -> list[int]:
    """Every step of ``STEPS`` that does durable work on ``system``."""
    return [
        index
        for index in range(len(STEPS))
        if index != CHECKPOINT or system.capabilities.checkpoint
    ]


def run_disk_faults(
    system: System,
    faults: str | Sequence[str],
    output_dir: Path,
    *,
    path: str = "*",
    count: int | None = None,
    seed: int = 0,
    steps: Sequence[int] | None = None,
    spec: str | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Every step of the workload made under each of ``faults`` (names of ``DISK_FAULTS``,
    or ``all``; on paths matching ``path``; ``count``: only the first ``count`` matching
    operations of the call fail, else every one until it returns); the record of the run,
    written to ``output_dir/disk-faults.json``. ``spec`` is how the system was named (its
    record and the command that runs it again say it). Everything is checked before the
    directory is touched."""
    names = fault_names([faults] if isinstance(faults, str) else faults)
    chosen = [(name, DiskFault.named(name, path=path, count=count)) for name in names]
    order = applicable_steps(system) if steps is None else list(steps)
    if system.server not in (None, "postgres", "redis"):
        raise CrashModeUnavailable(
            f"disk fault {names[0]}",
            f"{system.name} keeps its data in a {system.server} server's data directory,"
            " which the disk-fault runs do not yet put on the disk",
        )
    require_power_loss()
    output_dir = prepare_output_directory(output_dir)
    spec = spec or system.name
    started = time.perf_counter()
    cases: list[dict[str, Any]] = []
    due: list[Anomaly] = []
    planned = len(chosen) * len(order)
    said = labelled(progress, f"disk-faults {spec}")
    try:
        with ExitStack() as resources:
            template = None
            if system.server == "postgres":
                template = resources.enter_context(ClusterTemplate())
            run = _Run(system, seed, template)
            for name, fault in chosen:
                for index in order:
                    case_dir = output_dir / name / f"{index + 1:02d}-{STEPS[index]}"
                    case_dir.mkdir(parents=True)
                    case, found = run_case(run, fault, index, case_dir, output_dir)
                    case["disk_fault"] = name
                    cases.append(case)
                    prefix = _case_line(name, STEPS[index], "")
                    due += [finding.within(prefix) for finding in found]
                    if said is not None:
                        said(f"{len(cases)}/{planned} {name} {STEPS[index]}: {case['verdict']}")
    except Interrupted as interruption:
        interruption.partial["disk_fault_cases"] = [
            {key: case[key] for key in ("disk_fault", "step", "verdict", "directory")}
            for case in cases
        ]
        interruption.partial["disk_fault_cases_planned"] = planned
        interruption.partial["system"] = system.describe()
        raise
    summary = summarize(cases)
    own = [
        _case_line(case["disk_fault"], case["step"], f"without the fault too: {line}")
        for case in cases
        for line in case["found_without_the_fault"]
    ]
    ok = FAILED not in (c["verdict"] for c in cases) and summary["passed"] > 0
    reasons = texts(due) + own
    if not ok and not reasons:
        reasons = ["no case was exercised: the faults never reached an operation they cover"]
    record = {
        "system": system.describe(),
        "system_spec": spec,
        "system_import_path": import_path(spec),
        "reader": None if system.reader is None else system.reader.__module__,
        "disk_faults": names,
        "faults": {name: fault.to_json() for name, fault in chosen},
        "parameters": {"path": path, "count": count, "steps": [STEPS[i] for i in order]},
        "seed": seed,
        "cases": cases,
        "summary": summary,
        "headline": headline(summary, names),
        # A case is a fault x step: the faults' findings first, then the system's own.
        "anomalies": texts(due),
        "findings": to_json(due),
        "found_without_the_fault": own,
        "promises": classify(system, POWER_LOSS, due),
        # Nothing passed (every case unexercised, or failing without the fault too): a
        # check that did not pass is not "ok".
        "ok": ok,
        "reasons": reasons,
        "wall_s": round(time.perf_counter() - started, 2),
    }
    write_json(output_dir / RECORD_FILE, record)
    return record
