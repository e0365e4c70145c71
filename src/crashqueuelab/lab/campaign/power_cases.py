"""A crash case in power-loss mode: the child dies at its crash point and the disk loses
everything nobody synced; then every crash state the cut allows is judged and recovered.

The case's store directory is the mount point of a ``PowerLossDisk`` (its backing tree is
``disk/tree``); the effect ledger stays on the real disk, because it stands for another
machine's database. After the child's death the power is cut, and for each ``Choice`` of
``crash_choices`` a copy of the disk is made with the lost operations taken back
(``crash-states/<choice>/store``) beside a copy of the ledger. Each state is read by the
system's independent reader, its jobs are compared with what the crash point promises (an
acknowledged operation must survive), and recovery runs on it as a restarted system would.

Each distinct crash state is judged once (``DistinctStates``): a choice with the fates of
one already judged is skipped before anything is made, one that leaves the same bytes once
it is made; the case's report lists each skipped choice with the one it equals. A cut with
nothing unsynced is one crash state, and the report says so.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

from crashqueuelab.judges.findings import Anomaly, Kind, inconsistent, texts, to_json
from crashqueuelab.lab.campaign.cases import (
    continuity,
    crash_signature,
    death_finding,
    death_record,
    effects_finding,
    job_fields,
    kill_children,
    new_case,
    recover_or_report,
    unfinished_finding,
)
from crashqueuelab.lab.faults.children import CHILD_STDERR
from crashqueuelab.lab.faults.powerloss.brokerdisk import BrokerOnDisk
from crashqueuelab.lab.faults.powerloss.crashstate import (
    Choice,
    CrashState,
    DistinctStates,
    bounded_order,
    crash_choices,
)
from crashqueuelab.lab.faults.powerloss.journal import Journal
from crashqueuelab.lab.faults.powerloss.redisdisk import RedisOnDisk
from crashqueuelab.lab.faults.powerloss.serverdisk import ClusterTemplate, ServerOnDisk
from crashqueuelab.lab.faults.powerloss.targets import PowerLossTarget, StoreOnDisk
from crashqueuelab.lab.runs.readings import read_store
from crashqueuelab.lab.runs.records import write_json
from crashqueuelab.lab.workloads.observe import observe_ledger
from crashqueuelab.lab.workloads.scenario import LEDGER_FILE, STORE_DIRECTORY, effect_key
from crashqueuelab.systems.contract import (
    JobSpec,
    System,
)
from crashqueuelab.systems.crashpoints import (
    CrashPoint,
)

STATES_DIRECTORY = "crash-states"


class CaseStopped(Exception):
    """A case ended before its end (a power-loss case before all its crash states were
    judged, a failover case before it began): its run was interrupted or an earlier case
    raised, and its report is never read."""


def _jobs_of(signature: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    return {name: signature[name] for name in fields}


def lost_acknowledged(found: dict[str, Any], promised: dict[str, Any]) -> list[str]:
    """Where the jobs on the disk differ from what the crash point promised, field by field."""
    return [
        f"{name}: promised {promised[name]}, found {found[name]}"
        for name in promised
        if found[name] != promised[name]
    ]


def _copy_ledger(case_dir: Path, target: Path) -> None:
    for suffix in ("", "-wal"):
        source = case_dir / f"{LEDGER_FILE}{suffix}"
        if source.exists():
            shutil.copyfile(source, target / source.name)


def judge_state(
    case_dir: Path,
    target: PowerLossTarget,
    journal: Journal,
    choice: Choice,
    *,
    system: System,
    point: CrashPoint,
    jobs: tuple[JobSpec, ...],
    seed: int,
    case_id: str,
    distinct: DistinctStates,
) -> dict[str, Any] | None:
    """Make one crash state, read and judge it, recover it, and read and judge it again;
    None, and nothing kept, when its bytes are those of a state judged before."""
    state_dir = case_dir / STATES_DIRECTORY / choice.name
    state_dir.mkdir(parents=True)
    with target.place(journal, choice, state_dir, distinct) as placed:
        if placed.repeated:
            shutil.rmtree(state_dir)
            return None
        if placed.problem is not None:
            # Nothing can read this state, so nothing may recover it elsewhere either.
            refused = Anomaly(Kind.SERVER_REFUSED_CRASH_STATE, placed.problem)
            return {
                "choice": choice.name,
                "operations": placed.state.summary(),
                "fate": placed.state.fate,
                "crash_state": None,
                "durable_as_promised": False,
                "recovery": None,
                "anomalies": [refused.text],
                "findings": to_json([refused]),
                "passed": False,
                "directory": str(state_dir.relative_to(case_dir)),
            }
        return _judge_placed(
            case_dir, state_dir, placed.state,
            system=system, point=point, jobs=jobs, seed=seed, case_id=case_id,
        )  # fmt: skip


def _judge_placed(
    case_dir: Path,
    state_dir: Path,
    state: CrashState,
    *,
    system: System,
    point: CrashPoint,
    jobs: tuple[JobSpec, ...],
    seed: int,
    case_id: str,
) -> dict[str, Any]:
    _copy_ledger(case_dir, state_dir)
    keys = [job.key for job in jobs]
    crash_reading = read_store(system, state_dir / STORE_DIRECTORY, keys)
    signature = crash_signature(crash_reading, observe_ledger(state_dir / LEDGER_FILE), jobs, point)
    fields = job_fields(point)
    allowed = [_jobs_of(promised, fields) for promised in point.power_loss_states()]
    durable = _jobs_of(signature, fields) in allowed
    recovery, recovery_error = recover_or_report(state_dir, system, jobs, seed, case_id)
    recovered = read_store(system, state_dir / STORE_DIRECTORY, keys)
    ledger = observe_ledger(state_dir / LEDGER_FILE)
    effects_once = all(ledger["effects_by_key"].get(effect_key(job)) == 1 for job in jobs)
    anomalies: list[Anomaly] = []
    if not durable:
        found = _jobs_of(signature, fields)
        differences = lost_acknowledged(found, allowed[0])
        after = "recovery raised" if recovery is None else f"recovered to {recovery.states}"
        anomalies.append(
            Anomaly(
                Kind.ACKNOWLEDGED_WORK_LOST,
                f"acknowledged work lost: {'; '.join(differences)} ({after})",
                facts={"fields": ",".join(n for n in allowed[0] if found[n] != allowed[0][n])},
            )
        )
    anomalies += [inconsistent(problem, "at the crash: ") for problem in crash_reading.problems]
    anomalies += continuity(crash_reading, recovered)
    if recovery_error is not None:
        anomalies.append(recovery_error)
    anomalies += [inconsistent(problem, "after recovery: ") for problem in recovered.problems]
    if not effects_once:
        anomalies.append(effects_finding(ledger["effects_by_key"], jobs))
    if recovery is not None and not (recovery.terminal and recovery.succeeded):
        anomalies.append(unfinished_finding(recovery.states))
    write_json(state_dir / "history.json", list(recovered.history))
    return {
        "choice": state.choice.name,
        "operations": state.summary(),
        "fate": state.fate,
        "crash_state": {"store": crash_reading.to_json(), "signature": signature},
        "durable_as_promised": durable,
        "recovery": {
            "rounds": None if recovery is None else recovery.rounds,
            "final_states": None if recovery is None else recovery.states,
            "store": recovered.to_json(),
            "ledger": ledger,
            "each_effect_durable_once": effects_once,
        },
        "anomalies": texts(anomalies),
        "findings": to_json(anomalies),
        "passed": not anomalies,
        "directory": str(state_dir.relative_to(case_dir)),
    }


def _findings_of(state: dict[str, Any]) -> list[Anomaly]:
    found = [Anomaly.from_json(kept) for kept in state["findings"]]
    return [finding for finding in found if finding is not None]


def run_power_loss_case(
    output_dir: Path,
    index: int,
    point: CrashPoint,
    seed: int,
    *,
    system: System,
    spec: str,
    template: ClusterTemplate | None = None,
    stop: threading.Event | None = None,
    crash_states: int | None = None,
) -> dict[str, Any]:
    """One crash point: the child dies there, the power goes, every crash state is judged.

    ``template``: the cluster a PostgreSQL system's case starts from (its data directory is
    then what the disk holds); a Redis system's case starts a server of its own
    (``redisdisk``), a system on a RabbitMQ broker a node of its own (``brokerdisk``).
    ``crash_states``: judge at most this many, in ``bounded_order`` (None: every one); the
    report names each choice left unstarted. ``stop``, once set, ends the case before its
    next crash state (CaseStopped), its disk unmounted: the run it belongs to was
    interrupted."""
    case_id, case_dir, jobs = new_case(output_dir, index, point)
    target: PowerLossTarget
    if system.broker == "rabbitmq":
        target = BrokerOnDisk(case_dir, system)
    elif system.server == "redis":
        target = RedisOnDisk(case_dir, system.persistence or "rdb")
    elif template is not None:
        target = ServerOnDisk(case_dir, template)
    else:
        target = StoreOnDisk(case_dir)
    with target:
        child, prelude = kill_children(case_dir, spec, point, seed, case_id)
        journal = target.cut()
        started = time.perf_counter()
        states: list[dict[str, Any]] = []
        distinct = DistinctStates(journal)
        choices = crash_choices(journal, seed * 100 + index)
        if crash_states is not None:
            choices = bounded_order(choices, journal)
        unstarted: list[str] = []
        for choice in choices:
            if stop is not None and stop.is_set():
                raise CaseStopped(case_id)
            if crash_states is not None and len(states) >= crash_states:
                if not distinct.repeats(choice):
                    unstarted.append(choice.name)
                continue
            if not distinct.new_fate(choice):
                continue
            judged = judge_state(
                case_dir, target, journal, choice,
                system=system, point=point, jobs=jobs, seed=seed, case_id=case_id,
                distinct=distinct,
            )  # fmt: skip
            if judged is not None:
                states.append(judged)
    death = death_record(case_id, point, child, prelude, case_dir)
    anomalies = [] if death["died_at_fault_point"] else [death_finding(death)]
    anomalies += [
        finding.within(f"{state['choice']}: ", choice=state["choice"])
        for state in states
        for finding in _findings_of(state)
    ]
    relative = case_dir.relative_to(output_dir)
    report = {
        **death,
        "power_cut": {
            "pending_writes": len(journal.data),
            "pending_directory_changes": len(journal.names),
            "file_syncs": journal.synced_files,
            "directory_syncs": journal.synced_directories,
            "nothing_unsynced": not journal.data and not journal.names,
            "choices": len(choices),
            "crash_states": len(states),
            "duplicates_skipped": len(distinct.skipped),
            "states_bound": crash_states,
            # Choices never made: what they would have shown is not known.
            "choices_unstarted": unstarted,
        },
        "promised": point.power_loss_states(),
        "crash_states": states,
        "duplicate_crash_states": [same.to_json() for same in distinct.skipped],
        "states_passed": sum(1 for state in states if state["passed"]),
        "anomalies": texts(anomalies),
        "findings": to_json(anomalies),
        "passed": not anomalies,
        "artifacts": {
            "case_directory": str(relative),
            **target.artifacts(relative),
            "crash_states": str(relative / STATES_DIRECTORY),
            "effect_database": str(relative / LEDGER_FILE),
            "case_report": str(relative / "case.json"),
            "child_stderr": str(relative / CHILD_STDERR),
        },
        "timings": {
            "child_ms": round(child.elapsed_ms, 3),
            "states_ms": round((time.perf_counter() - started) * 1000, 3),
        },
    }
    write_json(case_dir / "case.json", report)
    return report
