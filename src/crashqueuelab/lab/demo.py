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
from crashqueuelab.judges.invariants import check_database
from crashqueuelab.judges.replay import replay_database
from crashqueuelab.lab.campaign import CHILD_TIMEOUT_S, LAST_WORDS_FILE, spawn_child
from crashqueuelab.lab.effects import Destination
from crashqueuelab.lab.faults import CRASH_EXIT_CODE, FaultPoint
from crashqueuelab.lab.handlers import SYNTHETIC_EFFECT, synthetic_handlers
from crashqueuelab.lab.observe import history_json, observe_ledger, observe_queue
from crashqueuelab.lab.reports import prepare_output_directory, read_json, write_json
from crashqueuelab.lab.scenario import LEASE_US, LEDGER_FILE, QUEUE_FILE, RETRY, START_US, open_case
from crashqueuelab.lab.worker import Worker

FAULT_POINT = FaultPoint.AFTER_EFFECT_COMMIT
DELIVERY_SEMANTICS = "at-least-once execution"
COMPARISON_FILE = "comparison.json"
DEFAULT_SEED = 20260827
IDEMPOTENCY_KEY = "request-1"
EFFECT_KEY = "effect-1"


def _scenario_figures(scenario_dir: Path) -> dict[str, Any]:
    """attempt_count, effect_count, final_state, invariants_ok: read from the retained files."""
    queue = observe_queue(scenario_dir / QUEUE_FILE)
    ledger = observe_ledger(scenario_dir / LEDGER_FILE)
    job = queue["jobs"][IDEMPOTENCY_KEY]
    return {
        "attempt_count": job["attempts"],
        "effect_count": ledger["effects_by_key"].get(EFFECT_KEY, 0),
        "final_state": job["state"],
        "invariants_ok": check_database(scenario_dir / QUEUE_FILE).ok,
    }


def run_scenario(scenario_dir: Path, *, destination: Destination, seed: int) -> dict[str, Any]:
    """Submit, crash a first worker after its effect, recover, let a second worker finish."""
    scenario_dir.mkdir(parents=True)
    clock = ManualClock(START_US)
    queue, ledger = open_case(
        scenario_dir,
        clock=clock,
        ids=SeededIds(seed, f"demo/{destination.value}/producer"),
        destination=destination,
    )
    with queue, ledger:
        queue.submit(
            idempotency_key=IDEMPOTENCY_KEY,
            job_type=SYNTHETIC_EFFECT,
            payload={"effect_key": EFFECT_KEY, "value": 7},
        )
    claimed_at = START_US + 1_000
    child = spawn_child(
        scenario_dir,
        [
            "--workload", "single-worker",
            "--fault-point", FAULT_POINT.value,
            "--seed", str(seed),
            "--case-id", f"demo/{destination.value}",
            "--destination", destination.value,
            "--start-us", str(claimed_at),
        ],
        timeout_s=CHILD_TIMEOUT_S,
    )  # fmt: skip
    last_words_path = scenario_dir / LAST_WORDS_FILE
    last_words = read_json(last_words_path) if last_words_path.is_file() else {}
    after_crash = _scenario_figures(scenario_dir)
    # The lease runs out; recovery schedules a retry; a second worker runs the job again.
    clock = ManualClock(claimed_at + LEASE_US)
    queue, ledger = open_case(
        scenario_dir,
        clock=clock,
        ids=SeededIds(seed, f"demo/{destination.value}/worker-b"),
        destination=destination,
    )
    with queue, ledger:
        recovered = queue.recover_expired()
        clock.advance(RETRY.delay_us(1))
        promoted = queue.promote_retries()
        second = Worker(
            queue,
            worker_id="worker-b",
            handlers=synthetic_handlers(ledger),
            lease_duration_us=LEASE_US,
        ).run_once()
    write_json(scenario_dir / "history.json", history_json(scenario_dir / QUEUE_FILE))
    figures = _scenario_figures(scenario_dir)
    ledger_state = observe_ledger(scenario_dir / LEDGER_FILE)
    report = {
        "destination": destination.value,
        "fault_point": FAULT_POINT.value,
        "first_worker": {
            "exit_code": child.exit_code,
            "timed_out": child.timed_out,
            "last_words": last_words.get("fault_point"),
            "died_at_fault_point": child.exit_code == CRASH_EXIT_CODE
            and last_words.get("fault_point") == FAULT_POINT.value,
            "state_after_crash": after_crash,
        },
        "recovery": {"recovered": recovered, "promoted": promoted},
        "second_worker": {"outcome": second.outcome.value, "attempt": second.attempt},
        "executions": ledger_state["effects"] + ledger_state["absorbed"],
        "absorbed_duplicates": ledger_state["absorbed"],
        "replay_ok": replay_database(scenario_dir / QUEUE_FILE).ok,
        **figures,
        "artifacts": {
            "queue_database": QUEUE_FILE,
            "effect_database": LEDGER_FILE,
            "history": "history.json",
            "report": "report.json",
        },
        "timings": {"first_worker_ms": round(child.elapsed_ms, 3)},
    }
    write_json(scenario_dir / "report.json", report)
    return report


def run_demo(output_dir: Path, *, seed: int = DEFAULT_SEED) -> dict[str, Any]:
    """Both scenarios, and ``comparison.json`` computed from their retained databases."""
    prepare_output_directory(output_dir)
    for destination in (Destination.NON_IDEMPOTENT, Destination.IDEMPOTENT):
        run_scenario(output_dir / destination.value, destination=destination, seed=seed)
    comparison = {
        "fault_point": FAULT_POINT.value,
        "idempotent": _scenario_figures(output_dir / Destination.IDEMPOTENT.value),
        "non_idempotent": _scenario_figures(output_dir / Destination.NON_IDEMPOTENT.value),
        "queue_delivery_semantics": DELIVERY_SEMANTICS,
    }
    write_json(output_dir / COMPARISON_FILE, comparison)
    return comparison
