"""The seeded process-fault campaign: one real child-process death at each fault point.

For every fault point, in an order drawn from a PRNG seeded by the caller, a fresh case
directory gets a fresh child process that runs the scripted workload and is killed with
``os._exit(86)`` at that point. The parent then:

1. records the exit code and the child's last words (which point killed it);
2. copies the crash-time databases aside and observes them read-only;
3. judges them (replay and invariants) as the crash left them;
4. drives recovery to a terminal result, as a restarted system would (re-run the
   idempotent producer, recover expired leases, promote retries, a fresh worker);
5. observes and judges the recovered databases.

Two runs with one seed produce JSON that differs only in the ``timings`` fields.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crashqueuelab.judges.invariants import check_database
from crashqueuelab.judges.replay import replay_database
from crashqueuelab.lab.effects import Destination
from crashqueuelab.lab.faults import CRASH_EXIT_CODE, FaultPoint
from crashqueuelab.lab.observe import history_json, observe_ledger, observe_queue
from crashqueuelab.lab.reports import prepare_output_directory, read_json, write_json
from crashqueuelab.lab.scenario import (
    LEDGER_FILE,
    QUEUE_FILE,
    RECOVERY_OFFSET_US,
    START_US,
    ScenarioJob,
    recover_case,
    scenario_jobs,
)

CRASH_MODE = "spawned_process_os_exit"
#: A child that has not died after this long is killed and recorded as a timeout.
CHILD_TIMEOUT_S = 60.0
CAMPAIGN_FILE = "campaign.json"
CRASH_TIME_DIR = "crash-time"
LAST_WORDS_FILE = "crash-point.json"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ExpectedCrashState:
    """The durable state a death at one fault point must leave (see docs/fault-model.md)."""

    effect_job: tuple[str, int] | None
    flaky_job: tuple[str, int] | None
    effect_job_effects: int
    last_event: str | None


_QUEUED = ("QUEUED", 0)
_EFFECT_LEASED = ("LEASED", 1)
_EFFECT_DONE = ("SUCCEEDED", 1)

EXPECTED_CRASH_STATES: dict[FaultPoint, ExpectedCrashState] = {
    FaultPoint.BEFORE_SUBMIT_COMMIT: ExpectedCrashState(None, None, 0, None),
    FaultPoint.AFTER_SUBMIT_COMMIT: ExpectedCrashState(_QUEUED, None, 0, "SUBMITTED"),
    FaultPoint.BEFORE_CLAIM_COMMIT: ExpectedCrashState(_QUEUED, _QUEUED, 0, "SUBMITTED"),
    FaultPoint.AFTER_CLAIM_COMMIT: ExpectedCrashState(_EFFECT_LEASED, _QUEUED, 0, "CLAIMED"),
    FaultPoint.AFTER_HEARTBEAT_COMMIT: ExpectedCrashState(_EFFECT_LEASED, _QUEUED, 0, "HEARTBEAT"),
    FaultPoint.BEFORE_EFFECT_COMMIT: ExpectedCrashState(_EFFECT_LEASED, _QUEUED, 0, "HEARTBEAT"),
    FaultPoint.AFTER_EFFECT_COMMIT: ExpectedCrashState(_EFFECT_LEASED, _QUEUED, 1, "HEARTBEAT"),
    FaultPoint.BEFORE_SUCCESS_COMMIT: ExpectedCrashState(_EFFECT_LEASED, _QUEUED, 1, "HEARTBEAT"),
    FaultPoint.AFTER_SUCCESS_COMMIT: ExpectedCrashState(_EFFECT_DONE, _QUEUED, 1, "SUCCEEDED"),
    FaultPoint.BEFORE_FAILURE_COMMIT: ExpectedCrashState(_EFFECT_DONE, ("LEASED", 1), 1, "CLAIMED"),
    FaultPoint.AFTER_FAILURE_COMMIT: ExpectedCrashState(
        _EFFECT_DONE, ("RETRY_SCHEDULED", 1), 1, "FAILED"
    ),
    FaultPoint.AFTER_PROMOTION_COMMIT: ExpectedCrashState(
        _EFFECT_DONE, ("QUEUED", 1), 1, "PROMOTED"
    ),
    FaultPoint.AFTER_RECOVERY_COMMIT: ExpectedCrashState(
        _EFFECT_DONE, ("RETRY_SCHEDULED", 2), 1, "LEASE_EXPIRED"
    ),
}


def campaign_order(seed: int) -> list[FaultPoint]:
    """Every fault point exactly once, in an order fixed by ``seed``."""
    points = list(FaultPoint)
    random.Random(seed).shuffle(points)
    return points


def case_id_for(index: int, point: FaultPoint) -> str:
    return f"{index + 1:02d}-{point.value.lower().replace('_', '-')}"


@dataclass(frozen=True)
class ChildRun:
    """How a crash child ended."""

    exit_code: int | None
    timed_out: bool
    elapsed_ms: float


def spawn_child(case_dir: Path, arguments: list[str], *, timeout_s: float) -> ChildRun:
    """Run ``python -m crashqueuelab.lab.crashchild`` with a bounded wait; kill it on timeout."""
    command = [sys.executable, "-m", "crashqueuelab.lab.crashchild", "--case-dir", str(case_dir)]
    started = time.perf_counter()
    with (case_dir / "child.stderr").open("wb") as stderr:
        child = subprocess.Popen(
            [*command, *arguments], stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr
        )
        try:
            exit_code: int | None = child.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            exit_code, timed_out = None, True
    return ChildRun(exit_code, timed_out, (time.perf_counter() - started) * 1000)


def preserve_crash_time(case_dir: Path) -> Path:
    """Copy the databases (with their WAL files) exactly as the dead child left them."""
    target = case_dir / CRASH_TIME_DIR
    target.mkdir()
    for name in (QUEUE_FILE, LEDGER_FILE):
        for suffix in ("", "-wal"):
            source = case_dir / f"{name}{suffix}"
            if source.exists():
                shutil.copyfile(source, target / source.name)
    return target


def judge(queue_path: Path) -> dict[str, Any]:
    """Replay and invariants on one queue database (an absent database has nothing to judge)."""
    if not queue_path.is_file():
        return {"replay_ok": True, "invariants_ok": True, "mismatches": [], "failed": []}
    replay = replay_database(queue_path)
    invariants = check_database(queue_path)
    return {
        "replay_ok": replay.ok,
        "invariants_ok": invariants.ok,
        "mismatches": [m.to_json() for m in replay.mismatches[:20]],
        "failed": invariants.failed(),
    }


def crash_signature(
    queue: dict[str, Any], ledger: dict[str, Any], jobs: tuple[ScenarioJob, ...]
) -> dict[str, Any]:
    """The part of an observation that identifies a fault point."""
    effect, flaky = jobs
    rows = queue["jobs"]

    def job(spec: ScenarioJob) -> list[Any] | None:
        row = rows.get(spec.idempotency_key)
        return None if row is None else [row["state"], row["attempts"]]

    return {
        "effect_job": job(effect),
        "flaky_job": job(flaky),
        "effect_job_effects": ledger["effects_by_key"].get(effect.effect_key, 0),
        "last_event": queue["last_event"],
    }


def _expected_signature(point: FaultPoint) -> dict[str, Any]:
    expected = EXPECTED_CRASH_STATES[point]
    return {
        "effect_job": None if expected.effect_job is None else list(expected.effect_job),
        "flaky_job": None if expected.flaky_job is None else list(expected.flaky_job),
        "effect_job_effects": expected.effect_job_effects,
        "last_event": expected.last_event,
    }


def _last_words(case_dir: Path) -> str | None:
    path = case_dir / LAST_WORDS_FILE
    if not path.is_file():
        return None
    point = read_json(path).get("fault_point")
    return point if isinstance(point, str) else None


def run_case(output_dir: Path, index: int, point: FaultPoint, seed: int) -> dict[str, Any]:
    """One fault point: spawn, kill, observe, judge, recover, judge again; the case report."""
    case_id = case_id_for(index, point)
    case_dir = output_dir / "cases" / case_id
    case_dir.mkdir(parents=True)
    jobs = scenario_jobs(case_id)
    child = spawn_child(
        case_dir,
        ["--fault-point", point.value, "--seed", str(seed), "--case-id", case_id],
        timeout_s=CHILD_TIMEOUT_S,
    )
    started = time.perf_counter()
    last_words = _last_words(case_dir)
    died_at_point = child.exit_code == CRASH_EXIT_CODE and last_words == point.value
    crash_dir = preserve_crash_time(case_dir)
    crash_queue = observe_queue(crash_dir / QUEUE_FILE)
    crash_ledger = observe_ledger(crash_dir / LEDGER_FILE)
    crash_judgement = judge(crash_dir / QUEUE_FILE)
    signature = crash_signature(crash_queue, crash_ledger, jobs)
    expected = _expected_signature(point)
    judged_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    recovery = recover_case(
        case_dir,
        jobs=jobs,
        seed=seed,
        stream=f"{case_id}/recovery",
        destination=Destination.IDEMPOTENT,
        start_us=START_US + RECOVERY_OFFSET_US,
    )
    recovered_queue = observe_queue(case_dir / QUEUE_FILE)
    recovered_ledger = observe_ledger(case_dir / LEDGER_FILE)
    recovered_judgement = judge(case_dir / QUEUE_FILE)
    recovery_ms = (time.perf_counter() - started) * 1000
    write_json(case_dir / "history.json", history_json(case_dir / QUEUE_FILE))
    effects_once = all(recovered_ledger["effects_by_key"].get(job.effect_key) == 1 for job in jobs)
    recovery_ok = (
        recovery.terminal
        and all(state == "SUCCEEDED" for state in recovery.states.values())
        and effects_once
        and recovered_judgement["replay_ok"]
        and recovered_judgement["invariants_ok"]
    )
    passed = (
        died_at_point
        and signature == expected
        and crash_judgement["replay_ok"]
        and crash_judgement["invariants_ok"]
        and recovery_ok
    )
    relative = case_dir.relative_to(output_dir)
    report = {
        "case_id": case_id,
        "fault_point": point.value,
        "exit_code": child.exit_code,
        "timed_out": child.timed_out,
        "last_words": last_words,
        "died_at_fault_point": died_at_point,
        "crash_state": {"queue": crash_queue, "ledger": crash_ledger, "signature": signature},
        "expected_crash_signature": expected,
        "crash_state_matches_point": signature == expected,
        "crash_replay": {
            "ok": crash_judgement["replay_ok"],
            "mismatches": crash_judgement["mismatches"],
        },
        "crash_invariants": {
            "ok": crash_judgement["invariants_ok"],
            "failed": crash_judgement["failed"],
        },
        "recovery": {
            "rounds": recovery.rounds,
            "terminal": recovery.terminal,
            "final_states": recovery.states,
            "queue": recovered_queue,
            "ledger": recovered_ledger,
            "replay_ok": recovered_judgement["replay_ok"],
            "invariants_ok": recovered_judgement["invariants_ok"],
            "each_effect_durable_once": effects_once,
        },
        "recovered_terminal_state": recovery.states,
        "recovery_ok": recovery_ok,
        "passed": passed,
        "artifacts": {
            "case_directory": str(relative),
            "queue_database": str(relative / QUEUE_FILE),
            "effect_database": str(relative / LEDGER_FILE),
            "crash_time_directory": str(relative / CRASH_TIME_DIR),
            "history": str(relative / "history.json"),
            "case_report": str(relative / "case.json"),
            "child_stderr": str(relative / "child.stderr"),
        },
        "timings": {
            "child_ms": round(child.elapsed_ms, 3),
            "crash_judgement_ms": round(judged_ms, 3),
            "recovery_ms": round(recovery_ms, 3),
        },
    }
    write_json(case_dir / "case.json", report)
    return report


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """The campaign's summary, computed from its case reports."""
    cases = report["cases"]
    return {
        "crash_mode": CRASH_MODE,
        "named_fault_points": len({case["fault_point"] for case in cases}),
        "passed": sum(1 for case in cases if case["passed"]),
        "failed": sum(1 for case in cases if not case["passed"]),
        "timeouts": sum(1 for case in cases if case["timed_out"]),
        "exit_codes": sorted(
            {case["exit_code"] for case in cases if case["exit_code"] is not None}
        ),
        "crash_time_replay_all_ok": all(case["crash_replay"]["ok"] for case in cases),
        "crash_time_invariants_all_ok": all(case["crash_invariants"]["ok"] for case in cases),
        "crash_states_all_match": all(case["crash_state_matches_point"] for case in cases),
        "recovery_all_succeeded": all(case["recovery_ok"] for case in cases),
    }


def run_campaign(
    output_dir: Path, *, seed: int, progress: Progress | None = None
) -> dict[str, Any]:
    """Run every fault point once, write ``campaign.json``, and return the report."""
    prepare_output_directory(output_dir)
    order = campaign_order(seed)
    started = time.perf_counter()
    cases = []
    for index, point in enumerate(order):
        case = run_case(output_dir, index, point, seed)
        cases.append(case)
        if progress is not None:
            verdict = "passed" if case["passed"] else "FAILED"
            progress(
                f"case {index + 1}/{len(order)} {point.value}: exit {case['exit_code']}, {verdict}"
            )
    report: dict[str, Any] = {
        "seed": seed,
        "crash_mode": CRASH_MODE,
        "execution_order": [point.value for point in order],
        "cases": cases,
    }
    report["summary"] = summarize(report)
    report["ok"] = report["summary"]["failed"] == 0
    report["timings"] = {"total_ms": round((time.perf_counter() - started) * 1000, 3)}
    write_json(output_dir / CAMPAIGN_FILE, report)
    return report
