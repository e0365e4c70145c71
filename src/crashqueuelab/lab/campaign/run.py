"""The seeded process-fault campaign: one real child-process death at each crash point of a
system, then the fencing probes.

For every crash point the system declares, in an order drawn from a PRNG seeded by the
caller, a fresh case directory gets a fresh child process that runs the scripted workload
and is killed with ``os._exit(86)`` at that point (a point marked ``after`` first kills one
child at that earlier point and then a second one while it recovers). The parent then:

1. records the exit code and the child's last words (which point killed it);
2. copies the crash-time store and ledger aside and reads them with the system's
   independent reader, which also judges them;
3. compares what it read with the state the system declares for that point;
4. drives recovery to a terminal result, as a restarted system would (re-run the
   idempotent producer, recover, a fresh worker);
5. reads and judges the recovered store, and checks that recovery lost nothing the crash
   had left (every job still there, attempts never going back, finished jobs unchanged).

In power-loss mode each case then cuts the power (``power_cases``); in failover mode each
case runs on a primary and a standby of its own, and the primary dies with the child
(``failover_cases``).

Two runs with one seed produce JSON that differs only in the ``timings`` fields (and, in
failover mode, in what each failover measured: its WAL positions, lag and times).
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Protocol, Self

from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.judges.findings import (
    Anomaly,
    texts,
    to_json,
)
from crashqueuelab.lab.campaign.cases import (
    CRASH_TIME_DIR,
    continuity,
    crash_signature,
    death_record,
    kill_children,
    new_case,
    preserve_crash_time,
    recover_or_report,
)
from crashqueuelab.lab.campaign.failover_cases import (
    STANDBY_HELD,
    STANDBY_STREAMS,
    FailoverSetting,
    run_failover_case,
)
from crashqueuelab.lab.campaign.power_cases import run_power_loss_case
from crashqueuelab.lab.campaign.probes import (
    check_probe_names,
    run_probes,
)
from crashqueuelab.lab.campaign.verdict import MECHANISM, anomalies_of, judge, summarize
from crashqueuelab.lab.faults.children import (
    CHILD_STDERR,
)
from crashqueuelab.lab.faults.crashmodes import check_crash_mode
from crashqueuelab.lab.faults.powerloss.serverdisk import ClusterTemplate
from crashqueuelab.lab.runs.commands import import_path
from crashqueuelab.lab.runs.interrupts import Interrupted
from crashqueuelab.lab.runs.kinds import CAMPAIGN
from crashqueuelab.lab.runs.modes import FAILOVER, POWER_LOSS, PROCESS
from crashqueuelab.lab.runs.progress import Progress, labelled
from crashqueuelab.lab.runs.promises import classify
from crashqueuelab.lab.runs.readings import read_store
from crashqueuelab.lab.runs.records import prepare_output_directory, write_json
from crashqueuelab.lab.runs.servers import naming
from crashqueuelab.lab.workloads.model import run_model_workload
from crashqueuelab.lab.workloads.observe import observe_ledger
from crashqueuelab.lab.workloads.scenario import (
    LEDGER_FILE,
    STORE_DIRECTORY,
    effect_key,
)
from crashqueuelab.servers.postgres import CRASHABLE_VARIABLE, SETTINGS, ThrowawayServer
from crashqueuelab.servers.syncpair import SynchronousPair
from crashqueuelab.systems.contract import (
    System,
)
from crashqueuelab.systems.crashpoints import (
    CrashPoint,
    id_reused_phases,
    open_commit_phases,
)
from crashqueuelab.systems.registry import DEFAULT_SYSTEM, resolve_system

CAMPAIGN_FILE = CAMPAIGN.record
#: Cases run side by side, each with its own child.
CASES_AT_ONCE = 2
#: The crash states judged per power-loss case of a system on RabbitMQ unless a run says:
#: each boots a node (6 to 9 s, docs/real-queues.md), and a cut leaves some 37 choices.
#: These are ``lose-all``, every pending directory change kept, and the zeroed tails.
RABBITMQ_CRASH_STATES = 3


def campaign_order(
    system: System, seed: int, only: Sequence[str] | None = None
) -> list[CrashPoint]:
    """Every crash point exactly once (or those named in ``only``), in an order fixed by
    ``seed`` (the same order, less the points left out)."""
    points = list(system.crash_points)
    random.Random(seed).shuffle(points)
    if only is None:
        return points
    known = {point.name for point in points}
    unknown = sorted(set(only) - known)
    if unknown:
        raise InvalidInput(
            "crash_point",
            f"{', '.join(unknown)}: {system.name} has no such crash point"
            f" (it has {', '.join(sorted(known))})",
        )
    return [point for point in points if point.name in only]


def run_case(
    output_dir: Path,
    index: int,
    point: CrashPoint,
    seed: int,
    *,
    system: System,
    spec: str,
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    """One crash point: spawn, kill, read, judge, recover, judge again; the case report.
    (``stop``: a process-death case is short, and runs to its end.)"""
    case_id, case_dir, jobs = new_case(output_dir, index, point)
    keys = [job.key for job in jobs]
    child, prelude = kill_children(case_dir, spec, point, seed, case_id)
    started = time.perf_counter()
    death = death_record(case_id, point, child, prelude, case_dir)
    died_at_point = death["died_at_fault_point"]
    crash_dir = preserve_crash_time(case_dir)
    crash_reading = read_store(system, crash_dir / STORE_DIRECTORY, keys)
    crash_ledger = observe_ledger(crash_dir / LEDGER_FILE)
    signature = crash_signature(crash_reading, crash_ledger, jobs, point)
    expected = point.expected.signature()
    judged_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    recovery, recovery_error = recover_or_report(case_dir, system, jobs, seed, case_id)
    recovered = read_store(system, case_dir / STORE_DIRECTORY, keys)
    recovered_ledger = observe_ledger(case_dir / LEDGER_FILE)
    recovery_ms = (time.perf_counter() - started) * 1000
    write_json(case_dir / "history.json", list(recovered.history))
    anomalies = continuity(crash_reading, recovered)
    if recovery_error is not None:
        anomalies.append(recovery_error)
    effects_once = all(recovered_ledger["effects_by_key"].get(effect_key(job)) == 1 for job in jobs)
    recovery_ok = (
        recovery is not None
        and recovery.terminal
        and recovery.succeeded
        and effects_once
        and recovered.ok
        and not anomalies
    )
    passed = died_at_point and signature == expected and crash_reading.ok and recovery_ok
    relative = case_dir.relative_to(output_dir)
    report = {
        **death,
        "crash_state": {
            "store": crash_reading.to_json(),
            "ledger": crash_ledger,
            "signature": signature,
        },
        "expected_crash_signature": expected,
        "crash_state_matches_point": signature == expected,
        "crash_judgement": {
            "ok": crash_reading.ok,
            "problems": list(crash_reading.problems),
            "checks": dict(crash_reading.checks),
        },
        "recovery": {
            "rounds": None if recovery is None else recovery.rounds,
            "terminal": recovery is not None and recovery.terminal,
            "final_states": None if recovery is None else recovery.states,
            "store": recovered.to_json(),
            "ledger": recovered_ledger,
            "judgement_ok": recovered.ok,
            "each_effect_durable_once": effects_once,
            "anomalies": texts(anomalies),
            "findings": to_json(anomalies),
        },
        "recovered_terminal_state": None if recovery is None else recovery.states,
        "recovery_ok": recovery_ok,
        "passed": passed,
        "artifacts": {
            "case_directory": str(relative),
            "store_directory": str(relative / STORE_DIRECTORY),
            "effect_database": str(relative / LEDGER_FILE),
            "crash_time_directory": str(relative / CRASH_TIME_DIR),
            "history": str(relative / "history.json"),
            "case_report": str(relative / "case.json"),
            "child_stderr": str(relative / CHILD_STDERR),
        },
        "timings": {
            "child_ms": round(child.elapsed_ms, 3),
            "crash_judgement_ms": round(judged_ms, 3),
            "recovery_ms": round(recovery_ms, 3),
        },
    }
    write_json(case_dir / "case.json", report)
    return report


#: The model workload's place in a campaign that ran named probes alone.
MODEL_NOT_RUN: dict[str, Any] = {
    "ran": False,
    "ok": True,
    "observations": 0,
    "anomalies": [],
    "detail": "not run: the campaign ran the probes it was given alone",
}


class CaseRunner(Protocol):
    def __call__(
        self,
        output_dir: Path,
        index: int,
        point: CrashPoint,
        seed: int,
        *,
        system: System,
        spec: str,
        stop: threading.Event | None = None,
    ) -> dict[str, Any]: ...


def _run_cases(
    output_dir: Path,
    order: list[CrashPoint],
    seed: int,
    chosen: System,
    spec: str,
    runner: CaseRunner,
    progress: Progress | None,
    at_once: int,
) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    stop = threading.Event()
    with ThreadPoolExecutor(max_workers=at_once) as pool:
        # The signal may land anywhere in this block (in a progress line as often as while
        # waiting on a case): wherever it does, the cases not started never start, and
        # those running stop at their next step (a power-loss case between two crash
        # states) and unmount their disks. Leaving the pool by its own exit instead would
        # wait for every case still queued.
        try:
            running = [
                pool.submit(
                    runner, output_dir, index, point, seed, system=chosen, spec=spec, stop=stop
                )
                for index, point in enumerate(order)
            ]
            for index, (point, future) in enumerate(zip(order, running, strict=True)):
                case = future.result()
                cases.append(case)
                if progress is not None:
                    verdict = "passed" if case["passed"] else "FAILED"
                    progress(
                        f"case {index + 1}/{len(order)} {point.name}: "
                        f"exit {case['exit_code']}, {verdict}"
                    )
        except Interrupted as interruption:
            stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
            interruption.partial["cases_done"] = len(cases)
            interruption.partial["cases_planned"] = len(order)
            interruption.partial["cases"] = cases
            raise
        except Exception:
            # A case that raised (a failover campaign's level the system refuses) ends the
            # run: the cases not started never start.
            stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return cases


#: The families of crash points that run on a server of their own, after the others, in
#: this order: the open-commit points hold a standby, which would stall every other case's
#: COMMIT on a shared server; the id-reused points crash their server.
HELD_OPEN = "held-open"
ID_REUSED = "id-reused"
OWN_SERVERS = (HELD_OPEN, ID_REUSED)


def own_server(point: CrashPoint) -> str | None:
    """The family of a point that runs on a server of its own (None: the run's server)."""
    if open_commit_phases(point.name) is not None:
        return HELD_OPEN
    if id_reused_phases(point.name) is not None:
        return ID_REUSED
    return None


def own_servers_last(order: list[CrashPoint], crash_mode: str) -> list[CrashPoint]:
    """``order`` with the points that need a server of their own last, family by family; a
    power-loss or failover campaign has none (its server per case is the one the power cut
    or the failover crashes, and a failover's standby is no held synchronous one)."""
    shared = [point for point in order if own_server(point) is None]
    if crash_mode in (POWER_LOSS, FAILOVER):
        return shared
    return shared + [
        point for family in OWN_SERVERS for point in order if own_server(point) == family
    ]


#: What a server whose open transactions' ids a crash must be able to hand out again runs
#: with: whatever flushes the WAL of an open transaction before the crash (the WAL writer
#: within 200 ms by default; the background writer, which flushes the WAL up to a dirty
#: page it writes; an autovacuum worker's commit) leaves its id known to the restarted
#: server. None of it changes what a COMMIT makes durable.
CRASHABLE_SETTINGS = dict(SETTINGS) | {
    "wal_writer_delay": "'10s'",
    "bgwriter_lru_maxpages": "0",
    "autovacuum": "off",
}


def _crashable_server() -> ThrowawayServer:
    return ThrowawayServer(settings=CRASHABLE_SETTINGS)


class OwnServers:
    """The servers of the families ``order`` needs, started in the background as the block
    begins (the other cases run meanwhile), and closed as it ends, also after a failure."""

    def __init__(self, order: Sequence[CrashPoint]) -> None:
        families = {own_server(point) for point in order}
        self.pair = SynchronousPair() if HELD_OPEN in families else None
        self.crashable = _crashable_server() if ID_REUSED in families else None
        starts: list[Callable[[], object]] = []
        if self.pair is not None:
            starts.append(self.pair.start)
        if self.crashable is not None:
            starts.append(self.crashable.start)
        self._errors: list[BaseException] = []
        self._starting = [
            threading.Thread(target=self._start, args=(start,), daemon=True) for start in starts
        ]

    def _start(self, start: Callable[[], object]) -> None:
        try:
            start()
        except BaseException as error:  # raised again by ``ready``, in the run's thread
            self._errors.append(error)

    def ready(self) -> None:
        """Wait until every server has started; a start that failed raises here."""
        for thread in self._starting:
            thread.join()
        if self._errors:
            raise self._errors[0]

    def __enter__(self) -> Self:
        for thread in self._starting:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        # A start still under way finishes first, so that what it started is closed.
        for thread in self._starting:
            thread.join()
        try:
            if self.pair is not None:
                self.pair.close()
        finally:
            if self.crashable is not None:
                self.crashable.close()


def _run_on_own_servers(
    output_dir: Path,
    order: list[CrashPoint],
    first: int,
    seed: int,
    chosen: System,
    spec: str,
    progress: Progress | None,
    servers: OwnServers,
) -> list[dict[str, Any]]:
    """The cases of ``order[first:]`` (``own_servers_last`` put them there), family by
    family, each family on its server, named to this process and its children while they
    run."""
    servers.ready()
    cases: list[dict[str, Any]] = []
    for family in OWN_SERVERS:
        points = [point for point in order[first:] if own_server(point) == family]
        if not points:
            continue
        with ExitStack() as naming_it:
            if family == HELD_OPEN:
                assert servers.pair is not None
                environment = servers.pair.environment()
                # A child killed while it held the standby would stall every later COMMIT.
                after_each: Callable[[], None] = servers.pair.release
                at_once = CASES_AT_ONCE
                said = "on a primary with a synchronous standby"
            else:
                server = servers.crashable
                assert server is not None
                environment = server.environment() | {CRASHABLE_VARIABLE: str(server.root)}
                after_each, at_once = _nothing, 1  # each case crashes the server
                said = "on a server each case crashes"
            for variable, value in environment.items():
                naming_it.enter_context(naming(variable, value))
            runner = functools.partial(_numbered, first + len(cases), after_each)
            cases += _run_cases(
                output_dir, points, seed, chosen, spec, runner, labelled(progress, said), at_once
            )
    return cases


def _nothing() -> None:
    return None


def _numbered(
    offset: int,
    after_each: Callable[[], None],
    output_dir: Path,
    index: int,
    point: CrashPoint,
    seed: int,
    *,
    system: System,
    spec: str,
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    """``run_case``, numbered after the cases run before (``offset``), then ``after_each``."""
    try:
        return run_case(
            output_dir, offset + index, point, seed, system=system, spec=spec, stop=stop
        )
    finally:
        after_each()


def _case_runner(
    chosen: System,
    crash_mode: str,
    failover: FailoverSetting | None,
    bound: int | None,
    resources: ExitStack,
) -> tuple[CaseRunner, int]:
    """What runs each case in ``crash_mode``, and how many run at a time."""
    # Cases share nothing (each has its own directory, clock and ids), and most of a case is
    # waiting for its child: two at a time keep both cores busy without changing any result.
    at_once = CASES_AT_ONCE if chosen.capabilities.concurrent_stores else 1
    if failover is not None:
        # Each case starts its own replicated server and names it to this process.
        return functools.partial(run_failover_case, setting=failover), 1
    if crash_mode != POWER_LOSS:
        return run_case, at_once
    runner = functools.partial(run_power_loss_case, crash_states=bound)
    if chosen.server == "redis":
        # Each case starts its own server (a RabbitMQ node too, for a system on one); they
        # take turns naming it to this process.
        return runner, 1
    if chosen.server is not None:
        # A server system's power-loss cases each name their own server to this process.
        template = resources.enter_context(ClusterTemplate())
        return functools.partial(runner, template=template), 1
    return runner, at_once


def run_campaign(
    output_dir: Path,
    *,
    seed: int,
    system: str = DEFAULT_SYSTEM,
    crash_mode: str = PROCESS,
    progress: Progress | None = None,
    crash_points: Sequence[str] | None = None,
    probes: Sequence[str] | None = None,
    failover: FailoverSetting | None = None,
    crash_states: int | None = None,
) -> dict[str, Any]:
    """Run every crash point of ``system`` once (or those named in ``crash_points``), the
    probes and the model workload; write ``campaign.json``. Naming ``probes`` runs those
    alone (with the crash points named, if any) and no model workload: a failing probe's
    rerun. Shrinking a run that is not ok is its caller's choice
    (``lab.reproducers.campaign.add_reproducers``). ``failover``: the replication setting
    of a ``failover`` campaign (``lab.failover.targets.case_failover`` makes it).
    ``crash_states``: in power-loss mode, at most this many crash states judged per case
    (None: every one, ``RABBITMQ_CRASH_STATES`` for a system on RabbitMQ); the choices
    left are named in each case and in ``not_run``."""
    chosen = resolve_system(system)
    check_crash_mode(crash_mode, chosen)
    if crash_states is not None and crash_mode != POWER_LOSS:
        raise InvalidInput("crash_states", f"bounds the crash states of {POWER_LOSS} alone")
    if probes is not None and crash_points is None:
        crash_points = []
    drawn = campaign_order(chosen, seed, crash_points)
    order = own_servers_last(drawn, crash_mode)
    left_out = sorted(point.name for point in drawn if point not in order)
    if crash_points is not None and left_out:
        raise InvalidInput(
            "crash_point",
            f"{', '.join(left_out)}: a point on a server of its own runs in the process crash"
            " mode only",
        )
    if (crash_mode == FAILOVER) != (failover is not None):
        raise InvalidInput(
            "synchronous_commit",
            "the replication setting of --crash-mode failover, and of it alone",
        )
    check_probe_names(probes)
    bound = crash_states
    if bound is None and crash_mode == POWER_LOSS and chosen.broker == "rabbitmq":
        bound = RABBITMQ_CRASH_STATES
    prepare_output_directory(output_dir)
    started = time.perf_counter()
    with ExitStack() as resources:
        runner, at_once = _case_runner(chosen, crash_mode, failover, bound, resources)
        named = labelled(progress, f"campaign {system} ({crash_mode})")
        shared = [point for point in order if own_server(point) is None]
        servers = resources.enter_context(OwnServers(order))
        cases = _run_cases(output_dir, shared, seed, chosen, system, runner, named, at_once)
        if len(shared) < len(order):
            cases += _run_on_own_servers(
                output_dir, order, len(shared), seed, chosen, system, named, servers
            )
    probed = run_probes(chosen, output_dir / "probes", only=probes)
    model = (
        run_model_workload(chosen, output_dir / "model", seed=seed)
        if probes is None
        else MODEL_NOT_RUN
    )
    report: dict[str, Any] = {
        "system": chosen.describe(),
        "system_spec": system,
        "seed": seed,
        "crash_mode": crash_mode,
        "mechanism": MECHANISM[crash_mode],
        "execution_order": [point.name for point in order],
        # In power-loss mode, the crash states judged per case at most (None: every one).
        "crash_states_per_case": bound,
        # None: every crash point the system declares ran.
        "crash_points_chosen": None if crash_points is None else sorted(set(crash_points)),
        "probes_chosen": None if probes is None else sorted(set(probes)),
        "system_import_path": import_path(system),
        "cases": cases,
        "probes": probed,
        "model": model,
    }
    if failover is not None:
        report["failover"] = {
            "synchronous_commit": failover.level,
            "promise": dict(failover.promise),
            "standby_held": STANDBY_STREAMS if failover.waits else STANDBY_HELD,
        }
    report["summary"] = summarize(report)
    findings = anomalies_of(report)
    report["anomalies"] = [line if isinstance(line, str) else line.text for line in findings]
    report["findings"] = to_json([line for line in findings if isinstance(line, Anomaly)])
    report["promises"] = classify(chosen, crash_mode, findings)
    report |= judge(report)
    report["timings"] = {"total_ms": round((time.perf_counter() - started) * 1000, 3)}
    report["shrink"] = None
    write_json(output_dir / CAMPAIGN_FILE, report)
    return report
