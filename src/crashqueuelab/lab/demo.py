"""The core experiment: an effect committed, then a crash before the acknowledgement.

A worker in a spawned child process commits the job's external effect and dies with
``os._exit`` at AFTER_EFFECT_COMMIT. The lease expires, recovery schedules another attempt,
and a second worker runs the job again and acknowledges it. The exact same schedule runs
against a non-idempotent destination (two durable effects) and an idempotent one (one
effect, the second application absorbed): two executions both times, which is what
at-least-once execution means.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crashqueuelab.core.clock import ManualClock
from crashqueuelab.core.ids import SeededIds
from crashqueuelab.lab.campaign import child as crash_child
from crashqueuelab.lab.faults.children import (
    CHILD_TIMEOUT_S,
    CRASH_EXIT_CODE,
    read_last_words,
    spawn_child,
)
from crashqueuelab.lab.runs.kinds import DEMO
from crashqueuelab.lab.runs.readings import read_store
from crashqueuelab.lab.runs.records import prepare_output_directory, write_json
from crashqueuelab.lab.workloads.effects import Destination
from crashqueuelab.lab.workloads.handlers import SYNTHETIC_EFFECT
from crashqueuelab.lab.workloads.observe import observe_ledger
from crashqueuelab.lab.workloads.scenario import (
    LEASE_US,
    LEDGER_FILE,
    RETRY,
    START_US,
    STORE_DIRECTORY,
    case_worker,
    open_case,
)
from crashqueuelab.systems.contract import JobSpec, System
from crashqueuelab.systems.registry import DEFAULT_SYSTEM, resolve_system

#: The effect ledger's crash point, the same for every system.
FAULT_POINT = "AFTER_EFFECT_COMMIT"
DELIVERY_SEMANTICS = "at-least-once execution"
COMPARISON_FILE = DEMO.record
DEFAULT_SEED = 20260827
IDEMPOTENCY_KEY = "request-1"
EFFECT_KEY = "effect-1"


def scenario_figures(system: System, scenario_dir: Path) -> dict[str, Any]:
    """attempt_count, effect_count, final_state, invariants_ok: read from the retained files."""
    reading = read_store(system, scenario_dir / STORE_DIRECTORY, [IDEMPOTENCY_KEY])
    ledger = observe_ledger(scenario_dir / LEDGER_FILE)
    job = reading.jobs.get(IDEMPOTENCY_KEY)
    return {
        "attempt_count": None if job is None else job.attempts,
        "effect_count": ledger["effects_by_key"].get(EFFECT_KEY, 0),
        "final_state": None if job is None else job.native_state,
        "final_status": None if job is None else job.status.value,
        "invariants_ok": reading.ok,
    }


def run_scenario(
    scenario_dir: Path, *, system: System, spec: str, destination: Destination, seed: int
) -> dict[str, Any]:
    """Submit, crash a first worker after its effect, recover, let a second worker finish."""
    scenario_dir.mkdir(parents=True)
    clock = ManualClock(START_US)
    client, ledger = open_case(
        scenario_dir,
        system,
        clock=clock,
        ids=SeededIds(seed, f"demo/{destination.value}/producer"),
        destination=destination,
    )
    try:
        client.submit(
            JobSpec(
                key=IDEMPOTENCY_KEY,
                job_type=SYNTHETIC_EFFECT,
                payload={"effect_key": EFFECT_KEY, "value": 7},
            )
        )
    finally:
        ledger.close()
        client.close()
    claimed_at = START_US + 1_000
    child = spawn_child(
        scenario_dir,
        crash_child.main,
        [
            "--system", spec,
            "--workload", "single-worker",
            "--fault-point", FAULT_POINT,
            "--seed", str(seed),
            "--case-id", f"demo/{destination.value}",
            "--destination", destination.value,
            "--start-us", str(claimed_at),
        ],
        timeout_s=CHILD_TIMEOUT_S,
        preload=[system.open.__module__],
    )  # fmt: skip
    last_words = read_last_words(scenario_dir)
    after_crash = scenario_figures(system, scenario_dir)
    # The lease runs out; recovery schedules a retry; a second worker runs the job again.
    clock = ManualClock(claimed_at + LEASE_US)
    client, ledger = open_case(
        scenario_dir,
        system,
        clock=clock,
        ids=SeededIds(seed, f"demo/{destination.value}/worker-b"),
        destination=destination,
    )
    try:
        recovered = client.recover()
        clock.advance(RETRY.delay_us(1))
        promoted = client.recover()
        second = case_worker(client, ledger, system, "worker-b", clock).run_once()
    finally:
        ledger.close()
        client.close()
    figures = scenario_figures(system, scenario_dir)
    history = read_store(system, scenario_dir / STORE_DIRECTORY, [IDEMPOTENCY_KEY]).history
    write_json(scenario_dir / "history.json", list(history))
    ledger_state = observe_ledger(scenario_dir / LEDGER_FILE)
    report = {
        "system": system.name,
        "destination": destination.value,
        "fault_point": FAULT_POINT,
        "first_worker": {
            "exit_code": child.exit_code,
            "timed_out": child.timed_out,
            "last_words": last_words,
            "died_at_fault_point": child.exit_code == CRASH_EXIT_CODE and last_words == FAULT_POINT,
            "state_after_crash": after_crash,
        },
        "recovery": {"moved_at_expiry": recovered, "moved_when_retry_due": promoted},
        "second_worker": {"outcome": second.outcome.value, "attempt": second.attempt},
        "executions": ledger_state["effects"] + ledger_state["absorbed"],
        "absorbed_duplicates": ledger_state["absorbed"],
        **figures,
        "artifacts": {
            "store_directory": STORE_DIRECTORY,
            "effect_database": LEDGER_FILE,
            "history": "history.json",
            "report": "report.json",
        },
        "timings": {"first_worker_ms": round(child.elapsed_ms, 3)},
    }
    write_json(scenario_dir / "report.json", report)
    return report


def run_demo(
    output_dir: Path, *, seed: int = DEFAULT_SEED, system: str = DEFAULT_SYSTEM
) -> dict[str, Any]:
    """Both scenarios, and ``comparison.json`` computed from their retained stores."""
    chosen = resolve_system(system)
    prepare_output_directory(output_dir)
    for destination in (Destination.NON_IDEMPOTENT, Destination.IDEMPOTENT):
        run_scenario(
            output_dir / destination.value,
            system=chosen,
            spec=system,
            destination=destination,
            seed=seed,
        )
    comparison = {
        "system": chosen.describe(),
        "fault_point": FAULT_POINT,
        "idempotent": scenario_figures(chosen, output_dir / Destination.IDEMPOTENT.value),
        "non_idempotent": scenario_figures(chosen, output_dir / Destination.NON_IDEMPOTENT.value),
        "queue_delivery_semantics": DELIVERY_SEMANTICS,
    }
    write_json(output_dir / COMPARISON_FILE, comparison)
    return comparison
