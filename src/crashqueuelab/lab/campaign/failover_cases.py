"""A crash case in failover mode: the child dies at its crash point on a primary, the
primary's machine dies with it, its standby is promoted, and the judges read the promoted
standby.

Each case starts a replicated PostgreSQL of its own (a primary and one streaming standby,
the standby's WAL through the lab's fault proxy) at the run's ``synchronous_commit`` level;
``lab.failover`` makes it (the command line hands it over as a ``FailoverSetting``: the
campaign imports nothing of that experiment). The case's store is made on the primary and
replayed by the standby before the child starts. At a level whose commits do not wait for
the standby (``off``, ``local``) the standby's link is then cut, so that it lags by all the
child will do: the tail such a level may lose. At the waiting levels it streams (a cut would
hold every COMMIT, and the child would never reach its point).

The child runs the scripted workload on the primary (through the proxy's client path) and
is killed at its point. At once:

1. the judges read the store on the primary, as the dead child left it: what the callers
   were told (compared with the state the point declares, as in process mode);
2. the primary is killed (SIGKILL of every process: nothing more is flushed or sent), the
   standby promoted and the clients' path moved to it (``ReplicatedPostgres.failover``);
   the bytes of WAL the standby lacked and the seconds to promote are kept;
3. the judges read the promoted standby: every job and every transition the primary held
   that the promoted standby lacks is listed (``failover_changes``): a job lost, gone
   back to an earlier state, or resurrected (finished on the primary, to run again);
4. the queue is opened on the promoted standby and asked for each job: its answers must
   be what the promoted standby holds;
5. recovery runs there, and the recovered store is read and judged, as in process mode.

A loss is then judged against the level's documented promise (``judge_failover``): where
it allows one (``off``, ``local``) the loss is documented, quoting the promise; where it
does not, it is a broken promise. Whatever the level, the promoted store must be
consistent, hold nothing the primary never had, and recover.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from crashqueuelab.core.clock import ManualClock
from crashqueuelab.core.errors import DurabilityUnavailable, InvalidInput
from crashqueuelab.core.ids import SeededIds
from crashqueuelab.judges.findings import Anomaly, Kind, inconsistent, system_raised, texts, to_json
from crashqueuelab.lab.campaign.cases import (
    case_id_for,
    continuity,
    crash_signature,
    death_finding,
    death_record,
    differs_finding,
    effects_finding,
    kill_children,
    new_case,
    preserve_crash_time,
    recover_or_report,
    unfinished_finding,
)
from crashqueuelab.lab.campaign.power_cases import CaseStopped
from crashqueuelab.lab.faults.children import CHILD_STDERR, ChildRun
from crashqueuelab.lab.faults.standbyhold import holding
from crashqueuelab.lab.runs.readings import read_store
from crashqueuelab.lab.runs.records import write_json
from crashqueuelab.lab.runs.servers import naming
from crashqueuelab.lab.workloads.observe import observe_ledger
from crashqueuelab.lab.workloads.scenario import (
    LEDGER_FILE,
    RETRY,
    ROLES,
    START_US,
    STORE_DIRECTORY,
    RecoveryResult,
    effect_key,
)
from crashqueuelab.servers.base import wait_until
from crashqueuelab.servers.postgres import LEVEL_VARIABLE
from crashqueuelab.systems.contract import (
    JobSpec,
    JobStatus,
    OpenRequest,
    StoreReading,
    System,
)
from crashqueuelab.systems.crashpoints import (
    CrashPoint,
    phase_before,
)

PROMOTED_DIR = "promoted"
#: How a run's standby lags, as its record says it.
STANDBY_STREAMS = "never held: every COMMIT waits for it"
STANDBY_HELD = (
    "held back from the phase before the COMMIT of each crash point's transition (from the"
    " child's start where a point names none)"
)
#: How long the standby may take to replay the new store before the child starts.
CAUGHT_UP_TIMEOUT_S = 30.0
#: What ``failover_changes`` calls each job the promoted standby holds otherwise.
LOST, WENT_BACK, RESURRECTED = "lost", "went back", "resurrected"
LEASE_WENT_BACK = "lease went back"
CHANGES = (LOST, WENT_BACK, RESURRECTED, LEASE_WENT_BACK)


class Replicated(Protocol):
    """A primary and its streaming standby (``lab.failover.cluster.ReplicatedPostgres``)."""

    def __enter__(self) -> Replicated: ...

    def __exit__(self, *exc: object) -> None: ...

    def client_environment(self) -> dict[str, str]: ...

    def reading_environment(self) -> dict[str, str]: ...

    def cut_replication(self) -> None: ...

    def lag(self) -> dict[str, Any]: ...

    def failover(self, promoted: Any = None, *, new_standbys: bool = True) -> dict[str, Any]: ...


class FailoverSetting(Protocol):
    """The replication setting a failover campaign runs at (``lab.failover.targets``)."""

    @property
    def level(self) -> str: ...

    @property
    def promise(self) -> Mapping[str, Any]: ...

    @property
    def waits(self) -> bool:
        """Whether a COMMIT waits for the standby at this level."""
        ...

    def cluster(self) -> Replicated: ...


# -- judging ------------------------------------------------------------------------------


def _event_key(event: Mapping[str, Any]) -> str:
    return json.dumps(event, sort_keys=True, default=str)


def event_text(event: Mapping[str, Any]) -> str:
    """One stored transition in a line: its kind, its job, its place in the log."""
    kind = event.get("event_type", event.get("type", "event"))
    job = event.get("job_id", event.get("job", "?"))
    where = f" (seq {event['seq']})" if "seq" in event else ""
    return f"{kind} of job {job}{where}"


def failover_changes(told: StoreReading, promoted: StoreReading) -> dict[str, Any]:
    """What the promoted standby holds otherwise than the primary did at the crash: each
    job lost, gone back to an earlier state, resurrected (finished on the primary, not
    finished on the standby: recovery runs it again), or with its lease ending earlier (a
    heartbeat's extension lost); each transition of the primary's
    history that the standby lacks; and what the standby holds that the primary never had
    (jobs, transitions), which no level allows."""
    jobs: list[dict[str, Any]] = []
    for key, was in sorted(told.jobs.items()):
        now = promoted.jobs.get(key)
        if now == was:
            continue
        if now is None:
            change = LOST
        elif was.status.is_terminal and not now.status.is_terminal:
            change = RESURRECTED
        elif (now.native_state, now.attempts) == (was.native_state, was.attempts):
            change = LEASE_WENT_BACK  # a heartbeat's extension lost: the holder was told more
        else:
            change = WENT_BACK
        jobs.append(
            {
                "job": key,
                "change": change,
                "primary": [was.native_state, was.attempts],
                "promoted": None if now is None else [now.native_state, now.attempts],
                "lease_deadlines_us": [
                    was.lease_deadline_us,
                    None if now is None else now.lease_deadline_us,
                ],
            }
        )
    kept = {_event_key(event) for event in promoted.history}
    had = {_event_key(event) for event in told.history}
    return {
        "jobs": jobs,
        "transitions_lost": [event_text(e) for e in told.history if _event_key(e) not in kept],
        "jobs_never_on_the_primary": sorted(set(promoted.jobs) - set(told.jobs)),
        "transitions_never_on_the_primary": [
            event_text(e) for e in promoted.history if _event_key(e) not in had
        ],
    }


def lost_anything(changes: Mapping[str, Any]) -> bool:
    return bool(changes["jobs"] or changes["transitions_lost"])


def _job_text(state: list[Any] | None, change: Mapping[str, Any], side: int) -> str:
    if state is None:
        return "absent"
    text = "/".join(map(str, state))
    if change["change"] == LEASE_WENT_BACK:
        text += f", its lease to {change['lease_deadlines_us'][side]} us"
    return text


def _changes_text(changes: Mapping[str, Any]) -> str:
    jobs = [
        f"job {one['job']} {one['change']} ({_job_text(one['primary'], one, 0)} on the primary,"
        f" {_job_text(one['promoted'], one, 1)} after promotion)"
        for one in changes["jobs"]
    ]
    lost = changes["transitions_lost"]
    said = f"{len(lost)} transition{'' if len(lost) == 1 else 's'} lost"
    transitions = [f"{said}: {', '.join(lost)}"] if lost else []
    return "; ".join(jobs + transitions)


def judge_failover(
    changes: Mapping[str, Any], promise: Mapping[str, Any]
) -> tuple[list[Anomaly], list[str]]:
    """The failover's findings and its documented losses: a loss the level's promise allows
    is documented (its line quotes the promise's setting), any other is a broken promise;
    what the primary never had is always a finding."""
    anomalies: list[Anomaly] = []
    documented: list[str] = []
    if lost_anything(changes):
        line = f"committed on the primary and absent after promotion: {_changes_text(changes)}"
        if promise["allows_loss"]:
            documented.append(f"{line} (documented: {promise['setting']} allows it)")
        else:
            anomalies.append(
                Anomaly(
                    Kind.ACKNOWLEDGED_WORK_LOST,
                    f"broken promise of {promise['setting']}: {line}",
                    facts={
                        "jobs": ",".join(one["job"] for one in changes["jobs"]),
                        "transitions_lost": len(changes["transitions_lost"]),
                    },
                )
            )
    foreign = changes["jobs_never_on_the_primary"] + changes["transitions_never_on_the_primary"]
    if foreign:
        anomalies.append(
            Anomaly(
                Kind.STORE_DIFFERS,
                f"the promoted standby holds what the primary never had: {', '.join(foreign)}",
            )
        )
    return anomalies, documented


def answers_differ(
    answers: Mapping[str, list[Any] | None], promoted: StoreReading
) -> list[Anomaly]:
    """Each job the queue, reopened on the promoted standby, answered otherwise than the
    standby holds it (``answers``: state and attempts by key, None for no such job)."""
    found = []
    for key, answer in sorted(answers.items()):
        stored = promoted.jobs.get(key)
        holds = None if stored is None else [stored.native_state, stored.attempts]
        if answer != holds:
            found.append(
                Anomaly(
                    Kind.REPORT_DIFFERS,
                    f"job {key}: the queue on the promoted standby answered {answer}, the"
                    f" standby holds {holds}",
                    job=key,
                )
            )
    return found


# -- the case -----------------------------------------------------------------------------


def _request(store: Path, seed: int, stream: str) -> OpenRequest:
    return OpenRequest(store, clock=ManualClock(START_US), ids=SeededIds(seed, stream), retry=RETRY)


def _ask(
    system: System, store: Path, keys: Sequence[str], seed: int, stream: str
) -> dict[str, list[Any] | None]:
    """Each job as the queue opened on ``store`` answers for it (state, attempts)."""
    client = system.open(_request(store, seed, stream))
    try:
        views = {key: client.job(key) for key in keys}
    finally:
        client.close()
    return {
        key: None if view is None else [view.native_state, view.attempts]
        for key, view in views.items()
    }


def _caught_up(cluster: Replicated) -> bool:
    return cluster.lag().get("lag_bytes") == 0


@contextmanager
def _named(values: Mapping[str, str]) -> Iterator[None]:
    with ExitStack() as stack:
        for variable, value in values.items():
            stack.enter_context(naming(variable, value))
        yield


def _read_copy(system: System, store: Path, target: Path, keys: Sequence[str]) -> StoreReading:
    """The store's descriptor copied to ``target`` and read there (the reader keeps what it
    read beside it)."""
    shutil.copytree(store, target / STORE_DIRECTORY)
    return read_store(system, target / STORE_DIRECTORY, keys)


@dataclass
class _Observed:
    """What a case saw on its replicated server, before and after the failover."""

    child: ChildRun
    prelude: dict[str, Any] | None
    crash_dir: Path
    caught_up: bool
    held: str
    told: StoreReading
    failover: dict[str, Any]
    promoted: StoreReading
    answers: dict[str, list[Any] | None] | None
    answered: list[Anomaly]
    recovery: RecoveryResult | None
    recovery_error: Anomaly | None
    recovered: StoreReading
    judged_ms: float
    recovery_ms: float


def _observe(
    case_dir: Path,
    point: CrashPoint,
    seed: int,
    case_id: str,
    jobs: tuple[JobSpec, ...],
    *,
    system: System,
    spec: str,
    setting: FailoverSetting,
) -> _Observed:
    """The case on its own replicated server: the store made on both, the standby held
    where the level lets commits go without it, the child killed at its point, the primary
    read and killed, the standby promoted, read, asked and recovered."""
    keys = [job.key for job in jobs]
    store = case_dir / STORE_DIRECTORY
    with (
        setting.cluster() as cluster,
        _named(cluster.client_environment() | {LEVEL_VARIABLE: setting.level}),
    ):
        try:
            _ask(system, store, keys, seed, f"{case_id}/prepare")  # the store exists on both
        except DurabilityUnavailable as error:
            raise InvalidInput(
                "synchronous_commit",
                f"{system.name} cannot run at synchronous_commit={setting.level}: {error}",
            ) from None
        caught_up = wait_until(lambda: _caught_up(cluster), CAUGHT_UP_TIMEOUT_S, poll_s=0.02)
        hold_at = None if setting.waits else phase_before(point.name)
        if not setting.waits and hold_at is None:
            cluster.cut_replication()  # no transition of its own: the whole case lags
        with holding(case_dir, cluster.cut_replication) as hold:
            child, prelude = kill_children(case_dir, spec, point, seed, case_id, hold_at=hold_at)
        started = time.perf_counter()
        crash_dir = preserve_crash_time(case_dir)
        with _named(cluster.reading_environment()):
            told = read_store(system, crash_dir / STORE_DIRECTORY, keys)
        # The promoted standby keeps the primary's settings: at a waiting level its every
        # COMMIT waits for a synchronous standby, so it gets one (a level that waits for
        # none needs none, and the case is the quicker for it).
        failover = cluster.failover(new_standbys=setting.waits)
        with _named(cluster.reading_environment()):
            promoted = _read_copy(system, store, case_dir / PROMOTED_DIR, keys)
        judged_ms = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        answers: dict[str, list[Any] | None] | None
        try:
            answers = _ask(system, store, keys, seed, f"{case_id}/promoted")
            answered = answers_differ(answers, promoted)
        except Exception as error:  # a system that cannot open there is reported
            answers, answered = None, [system_raised(error, call="open on the promoted")]
        recovery, recovery_error = recover_or_report(case_dir, system, jobs, seed, case_id)
        recovered = read_store(system, store, keys)
    held = (
        STANDBY_STREAMS
        if setting.waits
        else "from the child's start"
        if hold_at is None
        else f"from {hold_at}"
        if hold.made
        else f"not held: the child never reached {hold_at}"
    )
    return _Observed(
        child, prelude, crash_dir, caught_up, held, told, failover, promoted, answers, answered,
        recovery, recovery_error, recovered, judged_ms, (time.perf_counter() - started) * 1000,
    )  # fmt: skip


def run_failover_case(
    output_dir: Path,
    index: int,
    point: CrashPoint,
    seed: int,
    *,
    system: System,
    spec: str,
    setting: FailoverSetting,
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    """One crash point: the child dies there, the primary dies, the standby is promoted;
    the promoted standby is judged against what the primary held, and recovered.
    (``stop``: a case is short, and runs to its end; once set, by an interruption or by a
    case that raised, a case not begun never begins: CaseStopped.)"""
    if stop is not None and stop.is_set():
        raise CaseStopped(case_id_for(index, point))
    case_id, case_dir, jobs = new_case(output_dir, index, point)
    try:
        seen = _observe(
            case_dir, point, seed, case_id, jobs, system=system, spec=spec, setting=setting
        )
    except Exception:
        if stop is not None:  # the cases after this one never begin
            stop.set()
        raise
    ledger = observe_ledger(case_dir / LEDGER_FILE)
    crash_ledger = observe_ledger(seen.crash_dir / LEDGER_FILE)
    death = death_record(case_id, point, seen.child, seen.prelude, case_dir)
    signature = crash_signature(seen.told, crash_ledger, jobs, point)
    expected = point.expected.signature()
    changes = failover_changes(seen.told, seen.promoted)
    lost, documented = judge_failover(changes, setting.promise)
    anomalies = [] if death["died_at_fault_point"] else [death_finding(death)]
    if signature != expected and death["died_at_fault_point"]:
        anomalies.append(differs_finding(signature, expected))
    anomalies += [inconsistent(problem, "at the crash: ") for problem in seen.told.problems]
    anomalies += lost
    anomalies += [inconsistent(problem, "after promotion: ") for problem in seen.promoted.problems]
    anomalies += seen.answered
    anomalies += continuity(seen.promoted, seen.recovered)
    if seen.recovery_error is not None:
        anomalies.append(seen.recovery_error)
    anomalies += [inconsistent(problem, "after recovery: ") for problem in seen.recovered.problems]
    effects_once = all(ledger["effects_by_key"].get(effect_key(job)) == 1 for job in jobs)
    if not effects_once:
        _effects(anomalies, documented, ledger, jobs, changes)
    recovery = seen.recovery
    if recovery is not None and not (recovery.terminal and recovery.succeeded):
        done = {
            role: getattr(seen.recovered.jobs.get(job.key), "status", None) == JobStatus.SUCCEEDED
            for role, job in zip(ROLES, jobs, strict=True)
        }
        _unfinished(anomalies, documented, recovery.states, jobs, changes, done)
    write_json(case_dir / "history.json", list(seen.recovered.history))
    relative = case_dir.relative_to(output_dir)
    before = seen.failover.get("before", {})
    report = {
        **death,
        "failover": {
            "synchronous_commit": setting.level,
            "standby_held": seen.held,
            "standby_caught_up_before_the_child": seen.caught_up,
            "lag_bytes": before.get("lag_bytes"),
            "primary_lsn": before.get("primary_lsn"),
            "standby_flush_lsn": before.get("standby_flush_lsn"),
            "promoted_s": seen.failover["promoted_s"],
            "primary_killed_s": seen.failover["primary_killed_s"],
        },
        "crash_state": {"store": seen.told.to_json(), "signature": signature},
        "expected_crash_signature": expected,
        "crash_state_matches_point": signature == expected,
        "promoted_state": {
            "store": seen.promoted.to_json(),
            "signature": crash_signature(seen.promoted, crash_ledger, jobs, point),
        },
        "changes": changes,
        "lost_at_failover": lost_anything(changes),
        "documented": documented,
        "answers_on_the_promoted": seen.answers,
        "recovery": {
            "rounds": None if recovery is None else recovery.rounds,
            "final_states": None if recovery is None else recovery.states,
            "store": seen.recovered.to_json(),
            "ledger": ledger,
            "each_effect_durable_once": effects_once,
        },
        "recovered_terminal_state": None if recovery is None else recovery.states,
        "anomalies": texts(anomalies),
        "findings": to_json(anomalies),
        "passed": not anomalies,
        "artifacts": {
            "case_directory": str(relative),
            "store_directory": str(relative / STORE_DIRECTORY),
            "crash_time_directory": str(relative / seen.crash_dir.name),
            "promoted_directory": str(relative / PROMOTED_DIR),
            "effect_database": str(relative / LEDGER_FILE),
            "history": str(relative / "history.json"),
            "case_report": str(relative / "case.json"),
            "child_stderr": str(relative / CHILD_STDERR),
        },
        "timings": {
            "child_ms": round(seen.child.elapsed_ms, 3),
            "crash_judgement_ms": round(seen.judged_ms, 3),
            "recovery_ms": round(seen.recovery_ms, 3),
        },
    }
    write_json(case_dir / "case.json", report)
    return report


def _effects(
    anomalies: list[Anomaly],
    documented: list[str],
    ledger: Mapping[str, Any],
    jobs: tuple[JobSpec, ...],
    changes: Mapping[str, Any],
) -> None:
    """Effects not once after recovery (see ``_consequence``)."""
    counts = ledger["effects_by_key"]
    roles = {
        role for role, job in zip(ROLES, jobs, strict=True) if counts.get(effect_key(job)) != 1
    }
    finding = effects_finding(counts, jobs)
    _consequence(anomalies, documented, finding, roles, _taken_back(jobs, changes))


def _unfinished(
    anomalies: list[Anomaly],
    documented: list[str],
    states: Mapping[str, str],
    jobs: tuple[JobSpec, ...],
    changes: Mapping[str, Any],
    succeeded: Mapping[str, bool],
) -> None:
    """Jobs recovery did not bring to success (see ``_consequence``)."""
    roles = {role for role, done in succeeded.items() if not done}
    finding = unfinished_finding(states)
    _consequence(anomalies, documented, finding, roles, _taken_back(jobs, changes))


def _taken_back(jobs: tuple[JobSpec, ...], changes: Mapping[str, Any]) -> set[str]:
    keys = {one["job"] for one in changes["jobs"]}
    return {role for role, job in zip(ROLES, jobs, strict=True) if job.key in keys}


def _consequence(
    anomalies: list[Anomaly],
    documented: list[str],
    finding: Anomaly,
    roles: set[str],
    taken_back: set[str],
) -> None:
    """What recovery left that a documented loss explains, every job concerned one the
    failover took back (run again; or never submitted again, by a producer that had been
    told it was enqueued), is documented with it; a finding otherwise."""
    if documented and roles <= taken_back:
        documented.append(f"{finding.text}: after the jobs the failover took back")
    else:
        anomalies.append(finding)
