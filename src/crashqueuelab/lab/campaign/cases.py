"""What every crash case does, whatever the crash mode: kill children at a crash point, read
the signature a crash left, drive recovery, and check that recovery kept what the crash
left."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from crashqueuelab.judges.findings import Anomaly, Kind, system_raised
from crashqueuelab.lab.campaign import child
from crashqueuelab.lab.faults.children import (
    CHILD_STDERR,
    CHILD_TIMEOUT_S,
    CRASH_EXIT_CODE,
    ChildRun,
    read_last_words,
    read_points_reached,
    spawn_child,
)
from crashqueuelab.lab.workloads.effects import Destination
from crashqueuelab.lab.workloads.scenario import (
    LEDGER_FILE,
    RECOVERY_OFFSET_US,
    ROLES,
    START_US,
    STORE_DIRECTORY,
    RecoveryResult,
    deadline_label,
    effect_key,
    recover_case,
    scenario_jobs,
)
from crashqueuelab.systems.contract import (
    JobSpec,
    StoreReading,
    System,
)
from crashqueuelab.systems.crashpoints import (
    CrashPoint,
)
from crashqueuelab.systems.registry import resolve_system

#: The part of a crash signature that says where the jobs stood (the rest are facts about
#: the files, which a power cut may legitimately change).
JOB_FIELDS = ("effect_job", "flaky_job", "effect_job_effects")
#: The effect job's lease deadline, part of the jobs' fields where a point declares it.
DEADLINE_FIELD = "effect_job_deadline"
#: Where a case keeps the store and the ledger as the dead child left them.
CRASH_TIME_DIR = "crash-time"


def job_fields(point: CrashPoint) -> tuple[str, ...]:
    """The fields of a crash signature that a power cut must keep as ``point`` promises."""
    declared = point.expected.effect_deadline is not None
    return JOB_FIELDS + ((DEADLINE_FIELD,) if declared else ())


def case_id_for(index: int, point: CrashPoint) -> str:
    name = point.name.lower().replace("_", "-").replace(":", "-")
    return f"{index + 1:02d}-{name}"


def new_case(
    output_dir: Path, index: int, point: CrashPoint
) -> tuple[str, Path, tuple[JobSpec, JobSpec]]:
    """A case's id, its fresh directory under ``output_dir/cases`` and its workload's jobs."""
    case_id = case_id_for(index, point)
    case_dir = output_dir / "cases" / case_id
    case_dir.mkdir(parents=True)
    return case_id, case_dir, scenario_jobs(case_id)


def preserve_crash_time(case_dir: Path) -> Path:
    """Copy the store and the ledger exactly as the dead child left them."""
    target = case_dir / CRASH_TIME_DIR
    target.mkdir()
    store = case_dir / STORE_DIRECTORY
    if store.is_dir():
        # SQLite rebuilds its shared-memory index; a copy of a dead process's one is noise.
        shutil.copytree(store, target / STORE_DIRECTORY, ignore=shutil.ignore_patterns("*-shm"))
    for suffix in ("", "-wal"):
        source = case_dir / f"{LEDGER_FILE}{suffix}"
        if source.exists():
            shutil.copyfile(source, target / source.name)
    return target


def differs_finding(found: Mapping[str, Any], expected: Mapping[str, Any]) -> Anomaly:
    """A crash state that is not the one its point declares, field by field."""
    names = sorted(name for name in expected.keys() | found.keys()
                   if expected.get(name) != found.get(name))  # fmt: skip
    differences = [
        f"{name}: expected {expected.get(name)}, found {found.get(name)}" for name in names
    ]
    return Anomaly(
        Kind.CRASH_STATE_DIFFERS,
        f"the crash state differs from the point's: {'; '.join(differences)}",
        facts={"fields": ",".join(names)},
    )


def death_record(
    case_id: str, point: CrashPoint, child: ChildRun, prelude: dict[str, Any] | None, case_dir: Path
) -> dict[str, Any]:
    """How the case's children died, read from their exit codes and last words: whether each
    died at the point it was sent to."""
    last_words = read_last_words(case_dir)
    died = child.exit_code == CRASH_EXIT_CODE and last_words == point.name
    if prelude is not None:
        died = died and prelude["exit_code"] == CRASH_EXIT_CODE
    return {
        "case_id": case_id,
        "fault_point": point.name,
        "where": point.where,
        "after_crash_at": prelude,
        "exit_code": child.exit_code,
        "timed_out": child.timed_out or bool(prelude and prelude["timed_out"]),
        "last_words": last_words,
        "died_at_fault_point": died,
        "child_error": None if died else child_error(case_dir),
        "points_reached": None if died else read_points_reached(case_dir),
    }


def child_error(case_dir: Path) -> str | None:
    """The last line a child wrote to its stderr (a traceback's last line names the
    exception), so that a child that died of anything but its crash point says why."""
    try:
        text = (case_dir / CHILD_STDERR).read_text(errors="replace")
    except OSError:
        return None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else None


def death_summary(death: dict[str, Any]) -> str:
    """One line for a child that did not die where it was sent: a point the workload never
    reached says so and names the points it did reach; otherwise its exit, last words and
    last error line."""
    reached = death.get("points_reached")
    if death["exit_code"] == 0 and reached is not None:
        passed = ", ".join(reached) if reached else "none: the system never called its hook"
        return (
            f"crash point {death['fault_point']} was never reached: the workload ran to its"
            f" end (exit 0). The points the system's hook reached, in order: {passed}"
        )
    said = f", it said {death['child_error']!r}" if death.get("child_error") else ""
    return f"exit {death['exit_code']}, last words {death['last_words']}{said}"


def death_finding(death: dict[str, Any]) -> Anomaly:
    """``death_summary`` as a finding: the point never reached, or a death elsewhere."""
    text = death_summary(death)
    if death["exit_code"] == 0 and death.get("points_reached") is not None:
        return Anomaly(Kind.CRASH_POINT_NOT_REACHED, text, point=death["fault_point"])
    return Anomaly(
        Kind.CHILD_DIED_ELSEWHERE,
        text,
        point=death["fault_point"],
        facts={"exit_code": death["exit_code"], "last_words": str(death["last_words"])},
    )


def effects_finding(effects_by_key: Mapping[str, int], jobs: tuple[JobSpec, ...]) -> Anomaly:
    """The effects recovery left, when not each job's once: each job's count as a fact
    (``effect_effects``, ``flaky_effects``)."""
    return Anomaly(
        Kind.EFFECTS_NOT_ONCE,
        f"effects after recovery: {dict(effects_by_key)}",
        facts={
            f"{role}_effects": effects_by_key.get(effect_key(job), 0)
            for role, job in zip(ROLES, jobs, strict=True)
        },
    )


def unfinished_finding(states: Mapping[str, str]) -> Anomaly:
    """Recovery that did not bring every job to success: each job's final state as a fact
    (``effect_state``, ``flaky_state``)."""
    return Anomaly(
        Kind.RECOVERY_UNFINISHED,
        f"final states {dict(states)}",
        facts={f"{role}_state": state for role, state in states.items()},
    )


def _kill_at(
    case_dir: Path, spec: str, point: str, seed: int, case_id: str, extra: Sequence[str] = ()
) -> ChildRun:
    arguments = ["--system", spec, "--fault-point", point, "--seed", str(seed)]
    return spawn_child(
        case_dir,
        child.main,
        [*arguments, "--case-id", case_id, *extra],
        timeout_s=CHILD_TIMEOUT_S,
        preload=[resolve_system(spec).open.__module__],
    )


def crash_signature(
    reading: StoreReading, ledger: dict[str, Any], jobs: tuple[JobSpec, ...], point: CrashPoint
) -> dict[str, Any]:
    """The part of a reading that identifies a crash point (with the effect job's deadline
    where ``point`` declares it durable)."""
    effect, flaky = jobs

    def job(spec: JobSpec) -> list[Any] | None:
        stored = reading.jobs.get(spec.key)
        return None if stored is None else [stored.native_state, stored.attempts]

    deadline = {}
    if point.expected.effect_deadline is not None:
        stored = reading.jobs.get(effect.key)
        deadline[DEADLINE_FIELD] = deadline_label(
            None if stored is None else stored.lease_deadline_us
        )
    return {
        "effect_job": job(effect),
        "flaky_job": job(flaky),
        "effect_job_effects": ledger["effects_by_key"].get(effect_key(effect), 0),
        **deadline,
        **reading.facts,
    }


def continuity(before: StoreReading, after: StoreReading) -> list[Anomaly]:
    """What recovery lost or undid of the state the crash left, job by job."""
    anomalies = []
    for key, was in before.jobs.items():
        now = after.jobs.get(key)
        if now is None:
            anomalies.append(
                Anomaly(
                    Kind.LOST_IN_RECOVERY,
                    f"job {key}: {was.native_state}/{was.attempts} at the crash, missing after"
                    " recovery",
                    job=key,
                    attempt=was.attempts,
                    facts={"state": was.native_state},
                )
            )
        elif now.attempts < was.attempts:
            anomalies.append(
                Anomaly(
                    Kind.ATTEMPTS_WENT_BACK,
                    f"job {key}: attempts went back from {was.attempts} to {now.attempts}",
                    job=key,
                    attempt=now.attempts,
                    facts={"attempts_at_the_crash": was.attempts},
                )
            )
        elif was.status.is_terminal and now.status != was.status:
            anomalies.append(
                Anomaly(
                    Kind.FINISHED_JOB_UNDONE,
                    f"job {key}: {was.native_state} at the crash, {now.native_state} after"
                    " recovery",
                    job=key,
                    facts={"state_at_the_crash": was.native_state, "state": now.native_state},
                )
            )
    return anomalies


def recover_or_report(
    case_dir: Path, system: System, jobs: tuple[JobSpec, ...], seed: int, case_id: str
) -> tuple[RecoveryResult | None, Anomaly | None]:
    """Recovery's result, or why the system could not recover (never an exception)."""
    try:
        result = recover_case(
            case_dir,
            system,
            jobs=jobs,
            seed=seed,
            stream=f"{case_id}/recovery",
            destination=Destination.IDEMPOTENT,
            start_us=START_US + RECOVERY_OFFSET_US,
        )
    except Exception as error:  # a system that cannot recover is reported, not raised
        text = f"recovery raised {type(error).__name__}: {error}"
        return None, system_raised(error, text, call="recovery")
    return result, None


def kill_children(
    case_dir: Path,
    spec: str,
    point: CrashPoint,
    seed: int,
    case_id: str,
    *,
    hold_at: str | None = None,
) -> tuple[ChildRun, dict[str, Any] | None]:
    """The child killed at ``point``, after the one killed at ``point.after`` where set
    (``hold_at``: the phase at which the last child asks for its standby to be held back,
    ``lab.faults.standbyhold``)."""
    prelude = None
    if point.after is not None:
        first = _kill_at(case_dir, spec, point.after, seed, case_id)
        prelude = {
            "fault_point": point.after,
            "exit_code": first.exit_code,
            "last_words": read_last_words(case_dir),
            "timed_out": first.timed_out,
        }
    extra = [] if hold_at is None else ["--hold-at", hold_at]
    return _kill_at(case_dir, spec, point.name, seed, case_id, extra), prelude
