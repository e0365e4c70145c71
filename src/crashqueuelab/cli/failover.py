"""``crashqueuelab failover``: the PostgreSQL queue on a primary with a streaming standby,
or RQ on Redis with Sentinel, failed over under load while the standby lags; or a queue on a
three-node RabbitMQ cluster whose leader's node is killed (``lab.failover``)."""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from crashqueuelab.cli.common import (
    EXIT_OK,
    EXIT_REJECTED,
    Command,
    non_negative,
    positive,
    positive_number,
)
from crashqueuelab.cli.pages import html_report
from crashqueuelab.cli.progress import progress_for
from crashqueuelab.core.errors import InvalidInput, SystemUnavailable
from crashqueuelab.lab.failover.promises import LEVELS, MOST_ADVANCED, PROMOTIONS
from crashqueuelab.lab.runs.kinds import FAILOVER


def _failover(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    if args.system == "rabbitmq":
        return _rabbitmq(args)
    for name in (
        "queue_type",
        "ha_sync_mode",
        "ha_promote_on_failure",
        "nodes_killed",
        "work_ms",
        "partition_s",
        "partition_handling",
    ):
        if getattr(args, name) is not None:
            raise InvalidInput(name, f"a RabbitMQ setting: not for {args.system}")
    # The servers' client (psycopg, the postgres extra) is imported only for a run.
    try:
        from crashqueuelab.lab.failover.run import run_failover
        from crashqueuelab.lab.failover.targets import (
            library_target,
            postgres_target,
            rq_target,
        )
    except ImportError as error:
        raise SystemUnavailable(
            args.system, f"a failover run needs the {args.system} extra: {error}"
        ) from None

    if args.system == "rq":
        for name in ("synchronous_commit", "standbys", "promote"):
            if getattr(args, name) is not None:
                raise InvalidInput(name, "a PostgreSQL setting: not for rq")
        target = rq_target(
            args.min_replicas_to_write,
            args.min_replicas_max_lag,
            args.wait_replicas,
            args.wait_timeout_ms,
            args.primary_fault or "kill",
        )
    else:
        for name in ("min_replicas_to_write", "wait_replicas", "primary_fault"):
            if getattr(args, name):
                raise InvalidInput(name, f"a Redis setting: not for {args.system}")
        make = (
            postgres_target if args.system == "postgres" else partial(library_target, args.system)
        )
        target = make(
            args.synchronous_commit or "on",
            standbys=args.standbys or 1,
            promote=args.promote or MOST_ADVANCED,
        )
    record = run_failover(
        args.output_directory,
        target=target,
        failovers=args.failovers,
        jobs=args.jobs,
        workers=args.workers,
        rate_per_s=args.rate,
        lag_s=args.lag_s,
        lease_ms=args.lease_ms,
        seed=args.seed,
        restart_while_waiting=args.restart_while_waiting,
        terminate_waiting=args.terminate_waiting,
        deadline_s=args.deadline_s,
        progress=progress_for(args),
    )
    findings = record["findings"]
    return (EXIT_OK if record["ok"] else EXIT_REJECTED), {
        "ok": record["ok"],
        "keeps_its_promises": record["keeps_its_promises"],
        "judged": record["judged"],
        "headline": record["headline"],
        "reasons": record["reasons"],
        "system": record["system"],
        "setting": record["setting"],
        "promise": findings["promise"]["quoted"],
        "counts": findings["counts"],
        "documented": findings["documented"],
        "broken_promises": findings["broken_promises"],
        "contract_held": findings["contract_held"],
        "failovers": [
            {
                "lag_bytes": one["before"].get("lag_bytes"),
                "commits_waiting_for_the_standby": one["before"].get(
                    "commits_waiting_for_the_standby"
                ),
                "restarted_first": "restarted_at_s" in one,
                "sessions_terminated_while_waiting": one.get("sessions_terminated_while_waiting"),
                "promoted_s": one["promoted_s"],
            }
            | ({"promoted_slot": one["promoted_slot"]} if "promoted_slot" in one else {})
            for one in record["failovers"]
        ],
        "wall_s": record["wall_s"],
        "failover_report": str(args.output_directory / FAILOVER.record),
        "report": html_report(args.output_directory, args.stderr),
    }


def _rabbitmq(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    """A queue on a three-node RabbitMQ cluster, the node hosting its leader killed."""
    for name in ("synchronous_commit", "standbys", "promote"):
        if getattr(args, name) is not None:
            raise InvalidInput(name, "a PostgreSQL setting: not for rabbitmq")
    for name in (
        "min_replicas_to_write",
        "wait_replicas",
        "restart_while_waiting",
        "terminate_waiting",
        "primary_fault",
    ):
        if getattr(args, name):
            raise InvalidInput(name, "not a RabbitMQ setting")
    queue_type = args.queue_type or "quorum"
    if (args.partition_s is None) != (args.partition_handling is None):
        raise InvalidInput(
            "partition_s", "a partition needs both --partition-s and --partition-handling"
        )
    if args.partition_s is not None and args.nodes_killed is not None:
        raise InvalidInput("nodes_killed", "a partition kills no node")
    if queue_type == "quorum":
        for name in ("ha_sync_mode", "ha_promote_on_failure"):
            if getattr(args, name) is not None:
                raise InvalidInput(name, "a mirrored queue's policy: not for a quorum queue")
    try:
        from crashqueuelab.lab.failover.rabbitrun import run_rabbit_failover
    except ImportError as error:  # pragma: no cover - pika comes with the dramatiq extra
        raise SystemUnavailable("rabbitmq", f"a failover run needs pika: {error}") from None
    record = run_rabbit_failover(
        args.output_directory,
        queue_type=queue_type,
        sync_mode=args.ha_sync_mode or "manual",
        promote_on_failure=args.ha_promote_on_failure or "always",
        failovers=args.failovers,
        jobs=args.jobs,
        workers=args.workers,
        rate_per_s=args.rate,
        seed=args.seed,
        deadline_s=args.deadline_s,
        nodes_killed=args.nodes_killed or 1,
        work_ms=args.work_ms or 0,
        partition_handling=args.partition_handling,
        partition_s=args.partition_s or 0.0,
        progress=progress_for(args),
    )
    return rabbitmq_result(record, args.output_directory, args.stderr)


def rabbitmq_result(
    record: dict[str, Any], output_directory: Path, stderr: TextIO | None = None
) -> tuple[int, dict[str, Any]]:
    """The exit code and JSON of a RabbitMQ failover run, from its record."""
    findings = record["findings"]
    return (EXIT_OK if record["ok"] else EXIT_REJECTED), {
        "ok": record["ok"],
        "keeps_its_promises": record["keeps_its_promises"],
        "judged": record["judged"],
        "headline": record["headline"],
        "reasons": record["reasons"],
        "system": record["system"],
        "setting": findings["promise"]["setting"],
        "promise": findings["promise"]["quoted"],
        "counts": findings["counts"],
        "documented": findings["documented"],
        "broken_promises": findings["broken_promises"],
        "contract_held": findings["contract_held"],
        "failovers": [
            {
                "killed": one["killed"],
                "partitioned": one.get("partitioned", []),
                "survivor_took_over": one["survivor_took_over"],
                "new_leader": one["new_leader"],
                "synchronised_mirrors_before": one["before"].get("synchronised_mirrors"),
                "promoted_s": one["promoted_s"],
                "restarted_s": one["restarted_s"],
                "rejoined_s": one["rejoined_s"],
            }
            | (
                {
                    "minority_answered": "unanswered" not in one["minority_view"],
                    "partitions_seen": sorted(one["partitions_seen"]),
                    "restarted_by_the_lab": one["restarted"],
                }
                if one.get("fault") == "partition"
                else {}
            )
            for one in record["failovers"]
        ],
        "callers_told_failure": record["callers_told_failure"],
        "wall_s": record["wall_s"],
        "failover_report": str(output_directory / FAILOVER.record),
        "report": html_report(output_directory, stderr),
    }


def add_failover_command(command: Command) -> None:
    sub = command(
        "failover",
        _failover,
        "a queue on a replicated server the run starts (PostgreSQL with a streaming standby,"
        " or Redis with a replica and Sentinels), under load; the primary dies while the"
        " standby lags, the standby is promoted and the clients move to it: which"
        " acknowledged jobs were lost or came back, against what the replication setting"
        " promises (exit 4 without the server's binaries)",
        database=False,
    )
    # It starts its replicated servers itself: the command line starts none for it.
    sub.set_defaults(own_servers=True)
    sub.add_argument(
        "--system",
        choices=("postgres", "pgqueuer", "procrastinate", "rq", "rabbitmq"),
        default="postgres",
        help="crashqueuelab's PostgreSQL queue, pgqueuer or procrastinate on a primary and a"
        " streaming standby, RQ on a Redis primary, a replica and three Sentinels, or a queue"
        " on a three-node RabbitMQ cluster whose leader's node is killed (--queue-type)",
    )
    sub.add_argument(
        "--primary-fault",
        choices=("kill", "pause", "partition"),
        default=None,
        help="rq: what each failover does to the primary: SIGKILL of every process of it (the"
        " default); SIGSTOP until the Sentinels promoted the replica, then SIGCONT; or cut"
        " from the Sentinels and its replica through the proxy while its clients still reach"
        " it, until the Sentinels promoted the replica, then healed. Paused or cut off, it"
        " comes back a primary in its own eyes, answering its clients, until a Sentinel"
        " demotes it to a replica of the new primary",
    )
    sub.add_argument(
        "--queue-type",
        choices=("quorum", "mirrored"),
        default=None,
        help="rabbitmq: a quorum queue (the default) or a classic queue mirrored to every node"
        " (policy ha-mode all)",
    )
    sub.add_argument(
        "--ha-sync-mode",
        choices=("manual", "automatic"),
        default=None,
        help="rabbitmq --queue-type mirrored: the policy's ha-sync-mode (RabbitMQ's default,"
        " manual, by default)",
    )
    sub.add_argument(
        "--ha-promote-on-failure",
        choices=("always", "when-synced"),
        default=None,
        help="rabbitmq --queue-type mirrored: the policy's ha-promote-on-failure (RabbitMQ's"
        " default, always, by default)",
    )
    sub.add_argument(
        "--nodes-killed",
        type=int,
        choices=(1, 2),
        default=None,
        help="rabbitmq: the nodes each failover kills: the leader's (1, the default), or with"
        " it a synchronised mirror (a quorum queue's other member): a mirrored queue is left"
        " with an unsynchronised mirror where there is one, a quorum queue without a majority",
    )
    sub.add_argument(
        "--partition-s",
        type=positive_number,
        default=None,
        help="rabbitmq: instead of killing the leader's node, each failover cuts it from the"
        " other two for this many seconds (every Erlang distribution connection between them"
        " held by the lab's fault proxy); with --partition-handling",
    )
    sub.add_argument(
        "--partition-handling",
        choices=("ignore", "pause_minority", "autoheal"),
        default=None,
        help="rabbitmq --partition-s: the cluster's cluster_partition_handling (RabbitMQ's"
        " default is ignore; the lab then recovers as RabbitMQ's guide says: the minority's"
        " node stopped and started again)",
    )
    sub.add_argument(
        "--work-ms",
        type=non_negative,
        default=None,
        help="rabbitmq: how long a worker executes each job before acknowledging it (0 by"
        " default; slower than the producer, the queue grows a backlog)",
    )
    sub.add_argument(
        "--synchronous-commit",
        choices=LEVELS,
        default=None,
        help="postgres: the primary's level, on by default (synchronous_standby_names is '*':"
        " off and local do not wait for the standby, the others do)",
    )
    sub.add_argument(
        "--standbys",
        type=positive,
        default=None,
        help="postgres: 1 (synchronous_standby_names '*', the default) or 2 (quorum commit,"
        " 'ANY 1 (*)': a waiting commit waits for either; the lag is made on the second alone)",
    )
    sub.add_argument(
        "--promote",
        choices=PROMOTIONS,
        default=None,
        help="postgres with --standbys 2: which standby a failover promotes, the one that"
        f" received the most WAL ({MOST_ADVANCED}, the default) or the one whose link was cut",
    )
    sub.add_argument(
        "--min-replicas-to-write",
        type=non_negative,
        default=0,
        help="rq: the primary refuses writes unless this many replicas acknowledged it within"
        " --min-replicas-max-lag (0: asynchronous, Redis's default)",
    )
    sub.add_argument(
        "--wait-replicas",
        type=non_negative,
        default=0,
        help="rq: after each enqueue its client sends Redis's WAIT for this many replicas on"
        " the same connection, and tells the caller the outcome is unknown when fewer"
        " acknowledged within --wait-timeout-ms (0: no WAIT)",
    )
    sub.add_argument(
        "--wait-timeout-ms",
        type=positive,
        default=1000,
        help="rq: WAIT's timeout (see --wait-replicas)",
    )
    sub.add_argument(
        "--min-replicas-max-lag",
        type=positive,
        default=1,
        help="rq: seconds (see --min-replicas-to-write)",
    )
    sub.add_argument("--failovers", type=positive, default=2, help="failovers over the run")
    sub.add_argument(
        "--jobs",
        type=positive,
        default=600,
        help="jobs the producer submits (enough that each failover strikes while it still does)",
    )
    sub.add_argument("--workers", type=positive, default=2, help="worker threads")
    sub.add_argument(
        "--rate", type=positive_number, default=100.0, help="jobs the producer submits a second"
    )
    sub.add_argument(
        "--lag-s",
        type=positive_number,
        default=0.5,
        help="postgres, rq: how long the replication link is cut before each failover (the lag)",
    )
    sub.add_argument(
        "--lease-ms",
        type=positive,
        default=1000,
        help="postgres, rq: how long a claim's lease lasts",
    )
    sub.add_argument(
        "--restart-while-waiting",
        action="store_true",
        help="before each failover, the primary restarts while commits wait for the standby"
        " (PostgreSQL then marks them committed on the primary alone); waiting levels only",
    )
    sub.add_argument(
        "--terminate-waiting",
        action="store_true",
        help="before each failover, end the sessions whose COMMIT waits for the standby"
        " (pg_terminate_backend, as an administrator or a pooler's timeout would): PostgreSQL"
        " keeps their commits locally, and their clients lose the answer; waiting levels only",
    )
    sub.add_argument(
        "--deadline-s",
        type=positive_number,
        default=300.0,
        help="how long the load may take to drain after the last failover",
    )
