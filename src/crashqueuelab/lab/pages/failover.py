"""The page of a failover run: the level and what PostgreSQL promises of it, each failover
(the lag, the commits waiting, the promotion), and every job it lost or brought back."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from crashqueuelab.lab.pages.common import Verdict, View, read_json
from crashqueuelab.lab.runs.kinds import FAILOVER

_SYSTEMS = {
    "postgres": "postgres (crashqueuelab's PostgreSQL queue)",
    "pgqueuer": "pgqueuer (through its own queries)",
    "procrastinate": "procrastinate (through its own job manager)",
    "rq": "rq (RQ through Redis Sentinel)",
    "rabbitmq": "rabbitmq (a three-node RabbitMQ cluster, pika clients)",
}
#: Rows shown per kind of finding (the record holds them all).
SHOWN = 50
_KIND_TEXT = {
    "lost_enqueues": "acknowledged enqueues lost: the final store has no such job",
    "resurrected_completions": "acknowledged completions that came back: run again, or not"
    " succeeded at the end",
    "leases_came_back": "leases that came back: the promoted standby holds the job leased under"
    " the attempt whose completion was acknowledged",
    "duplicate_effects": "effects twice: a job executed again after one of its executions was"
    " acknowledged",
}
#: A RabbitMQ run's findings (``lab.failover.deliveries``): a message queue keeps no row per
#: job, so no lease can come back; a completion comes back as a delivery.
_RABBIT_TEXT = {
    "lost_enqueues": "confirmed enqueues lost: never delivered, and the queue empty at the end",
    "resurrected_completions": "acknowledged deliveries that came back: the same message"
    " delivered again after its acknowledgement was answered",
    "duplicate_effects": "effects twice: a job delivered again after one of its deliveries was"
    " acknowledged (the same message, or a copy published again after a lost confirm)",
}


def _rabbit_command(record: dict[str, Any], run_dir: Path) -> str:
    parameters = record["parameters"]
    options = [f"--system rabbitmq --queue-type {parameters['queue_type']}"]
    if parameters["queue_type"] == "mirrored":
        options.append(
            f"--ha-sync-mode {parameters['ha_sync_mode']}"
            f" --ha-promote-on-failure {parameters['ha_promote_on_failure']}"
        )
    options += [
        f"--failovers {parameters['failovers']}",
        f"--jobs {parameters['jobs']}",
        f"--workers {parameters['workers']}",
        f"--rate {parameters['rate_per_s']:g}",
        f"--seed {parameters['seed']}",
        f"--deadline-s {parameters['deadline_s']:g}",
    ]
    if parameters.get("fault") == "partition":
        options.append(
            f"--partition-s {parameters['partition_s']:g}"
            f" --partition-handling {parameters['partition_handling']}"
        )
    elif parameters.get("nodes_killed", 1) > 1:
        options.append(f"--nodes-killed {parameters['nodes_killed']}")
    if parameters.get("work_ms"):
        options.append(f"--work-ms {parameters['work_ms']}")
    return (
        f"crashqueuelab failover {' '.join(options)} --output-directory {shlex.quote(str(run_dir))}"
    )


def _command(record: dict[str, Any], run_dir: Path) -> str:
    if record["system"] == "rabbitmq":
        return _rabbit_command(record, run_dir)
    parameters = record["parameters"]
    setting = record["findings"]["level"]
    chosen = (
        f"--system rq --min-replicas-to-write {record['server'].get('min_replicas', 1)}"
        f" --min-replicas-max-lag {record['server'].get('max_lag_s', 1)}"
        if setting == "min-replicas"
        else f"--system rq --wait-replicas {record['server'].get('wait_replicas', 1)}"
        f" --wait-timeout-ms {record['server'].get('wait_timeout_ms', 1000)}"
        if setting == "wait"
        else "--system rq"
        if setting == "asynchronous"
        else f"--system {record['system']} --synchronous-commit {setting}"
        if record["system"] != "postgres"
        else f"--synchronous-commit {setting}"
    )
    options = [
        chosen,
        f"--failovers {parameters['failovers']}",
        f"--jobs {parameters['jobs']}",
        f"--workers {parameters['workers']}",
        f"--rate {parameters['rate_per_s']:g}",
        f"--lag-s {parameters['lag_s']:g}",
        f"--lease-ms {parameters['lease_ms']}",
        f"--seed {parameters['seed']}",
        f"--deadline-s {parameters['deadline_s']:g}",
    ]
    if parameters.get("standbys", 1) > 1:
        options[1:1] = [
            f"--standbys {parameters['standbys']}",
            f"--promote {parameters['promote']}",
        ]
    if record["server"].get("primary_fault", "kill") != "kill":
        options.append(f"--primary-fault {record['server']['primary_fault']}")
    if parameters["restart_while_waiting"]:
        options.append("--restart-while-waiting")
    if parameters.get("terminate_waiting"):
        options.append("--terminate-waiting")
    return (
        f"crashqueuelab failover {' '.join(options)} --output-directory {shlex.quote(str(run_dir))}"
    )


def _rabbit_faults(record: dict[str, Any]) -> str:
    if record["parameters"].get("fault") == "partition":
        return "partitions of the leader's node"
    return "leader kills"


def failover_view(run_dir: Path) -> View:
    record = read_json(run_dir / FAILOVER.record)
    findings = record["findings"]
    promise = findings["promise"]
    verdict = Verdict(
        ok=record["ok"],
        title=(
            f"failover: {len(record['failovers'])} {_rabbit_faults(record)} of a"
            f" {promise['setting']}"
            if record["system"] == "rabbitmq"
            else f"failover: {len(record['failovers'])} at {promise['setting']}"
        ),
        system=_SYSTEMS.get(record["system"], record["system"]),
        durability=str(record["server"].get("replication", promise["setting"])),
        seed=record["parameters"]["seed"],
        duration=record["wall_s"],
        command=_command(record, run_dir),
        reasons=record["reasons"],
    )
    counts = findings["counts"]
    figures = [
        ("jobs", str(findings["jobs"]), "submitted one at a time by the producer"),
        ("enqueues acknowledged", str(findings["enqueues_acknowledged"]), "as the ledger says"),
        (
            "completions acknowledged",
            str(findings["completions_acknowledged"]),
            "jobs a worker was told it completed",
        ),
        ("jobs affected", str(counts["jobs_affected"]), "distinct jobs with a finding"),
        (
            "allowed by the setting",
            str(findings["documented"]),
            "findings the setting's documentation allows",
        ),
        ("broken promises", str(findings["broken_promises"]), "findings the setting rules out"),
    ]
    if "waiting_commits" in promise:
        figures.append(
            (
                "shown by a restarted primary, then gone",
                str(counts["visible_then_lost"]),
                "PostgreSQL documents it: commits waiting for the standby at a restart",
            )
        )
    kinds = _RABBIT_TEXT if record["system"] == "rabbitmq" else _KIND_TEXT
    sections = [
        {
            "name": kind,
            "text": text,
            "count": counts[kind],
            "rows": findings[kind][:SHOWN],
        }
        for kind, text in kinds.items()
    ]
    data = {
        "headline": record["headline"],
        "promise": promise,
        "server": record["server"],
        "failovers": record["failovers"],
        "sections": sections,
        "visible_then_lost": findings.get("visible_then_lost", [])[:SHOWN],
        "shown": SHOWN,
        "final_store": record["final_store"],
        "told_failure": record.get("callers_told_failure", {}),
        "active": record.get("active_at_the_end", []),
        "evidence": record["evidence"],
        "rabbitmq": record["system"] == "rabbitmq",
        "parameters": record["parameters"],
        "partition": record["parameters"].get("fault") == "partition",
    }
    return View("failover.html.j2", verdict, figures, data)
