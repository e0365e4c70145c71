"""The child process of a crash case: forked for it from the run's fork server
(``lab.faults.children.spawn_child`` calls ``main``), or ``python -m
crashqueuelab.lab.campaign.child ...`` by hand.

It runs one scripted workload on the named system with a hook that calls ``os._exit`` at the
chosen crash point, so the parent sees a real process death: no ``finally`` block, no
``atexit`` handler and no connection close runs after the crash point. At a reply-lost
point the answer to the transition's COMMIT is lost first (``lostreplies.py``); at an
open-commit point the COMMIT is also still waiting for a held standby then
(``opencommits.py``); at an id-reused point the server crashes first and hands the
transaction's id to another session (``idreuse.py``).

Exit status: 86 (``CRASH_EXIT_CODE``) when it died at its crash point; 0 when the workload
finished without reaching it (a failed case); 1 on any error (traceback on stderr, which
the parent keeps as ``child.stderr``). A child that did not die leaves the points it did
reach, in order, in ``POINTS_REACHED_FILE``, so the case can say which points the system's
hook really passed.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from crashqueuelab.lab.faults.children import LAST_WORDS_FILE, POINTS_REACHED_FILE
from crashqueuelab.lab.faults.hooks import exit_at
from crashqueuelab.lab.faults.idreuse import id_reused_at
from crashqueuelab.lab.faults.lostreplies import replies_lost_at
from crashqueuelab.lab.faults.opencommits import commits_held_open_at
from crashqueuelab.lab.faults.standbyhold import ask_for_hold
from crashqueuelab.lab.runs.systemcalls import NamedCalls
from crashqueuelab.lab.workloads.effects import Destination
from crashqueuelab.lab.workloads.scenario import run_campaign_workload, run_single_worker_workload
from crashqueuelab.systems.contract import (
    OpenRequest,
    QueueClient,
    System,
)
from crashqueuelab.systems.crashpoints import (
    id_reused_phases,
    open_commit_phases,
    reply_lost_phases,
)
from crashqueuelab.systems.registry import DEFAULT_SYSTEM, resolve_system


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m crashqueuelab.lab.campaign.child")
    parser.add_argument("--case-dir", type=Path, required=True)
    parser.add_argument("--system", default=DEFAULT_SYSTEM)
    parser.add_argument("--fault-point", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--case-id", required=True)
    parser.add_argument("--workload", choices=["campaign", "single-worker"], default="campaign")
    parser.add_argument(
        "--destination", choices=[d.value for d in Destination], default="idempotent"
    )
    parser.add_argument("--start-us", type=int, default=0)
    parser.add_argument(
        "--hold-at",
        default=None,
        help="the phase at which the run is asked to hold its standby back (a failover case)",
    )
    args = parser.parse_args(argv)
    system = named_calls(resolve_system(args.system))
    last_words = str(args.case_dir / LAST_WORDS_FILE)
    with ExitStack() as stack:
        if reply_lost_phases(args.fault_point) is not None:
            die = stack.enter_context(replies_lost_at(args.fault_point, last_words))
        elif open_commit_phases(args.fault_point) is not None:
            die = stack.enter_context(commits_held_open_at(args.fault_point, last_words))
        elif id_reused_phases(args.fault_point) is not None:
            die = stack.enter_context(id_reused_at(args.fault_point, last_words))
        else:
            die = exit_at(args.fault_point, last_words=last_words)
        return _run(args, system, die)


def named_calls(system: System) -> System:
    """``system``, its clients naming the call that raised (``NamedCalls``)."""
    opened = system.open

    def open_named(request: OpenRequest) -> QueueClient:
        client: QueueClient = NamedCalls(system.name, opened(request))
        return client

    return replace(system, open=open_named)


def _run(args: argparse.Namespace, system: System, die: Callable[[str], None]) -> int:
    reached: list[str] = []

    def hook(point: str) -> None:
        if point not in reached:
            reached.append(point)
            if point == args.hold_at:
                ask_for_hold(args.case_dir)
        die(point)

    try:
        if args.workload == "campaign":
            run_campaign_workload(
                args.case_dir, system, case_id=args.case_id, seed=args.seed, hook=hook
            )
        else:
            run_single_worker_workload(
                args.case_dir,
                system,
                case_id=args.case_id,
                seed=args.seed,
                destination=Destination(args.destination),
                start_us=args.start_us,
                hook=hook,
            )
    finally:  # not reached by a death at the crash point: os._exit runs no finally
        (args.case_dir / POINTS_REACHED_FILE).write_text(json.dumps(reached))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
