"""Systems from outside the package: the docs' walk-through adapter passes, broken ones are
reported with the anomaly named (job and what happened), never with a traceback."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from crashqueuelab import cli
from crashqueuelab.core.errors import SystemUnavailable
from crashqueuelab.systems import OpenRequest, QueueClient, System, resolve_system
from crashqueuelab.systems.contract import Claim
from crashqueuelab.systems.sqlite import SqliteClient, sqlite_system
from tests.conftest import EXAMPLES, RunCli


@pytest.fixture(autouse=True)
def examples_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))


def test_postgres_without_a_server_says_how_to_get_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from crashqueuelab.core.clock import ManualClock
    from crashqueuelab.core.ids import SeededIds
    from crashqueuelab.core.retry import RetryPolicy
    from crashqueuelab.servers.postgres import DSN_VARIABLE
    from crashqueuelab.systems import OpenRequest

    monkeypatch.delenv(DSN_VARIABLE, raising=False)
    system = resolve_system("postgres")
    assert system.server == "postgres"
    request = OpenRequest(tmp_path, ManualClock(1), SeededIds(1), RetryPolicy())
    with pytest.raises(SystemUnavailable, match="no server: the command line starts one"):
        system.open(request)


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        (
            "oracle",
            "not one of arq, arq-aof-always, celery, celery-acks-late, celery-gevent-acks-late,"
            " celery-rabbitmq, celery-rabbitmq-acks-late, celery-solo, dramatiq,"
            " dramatiq-aof-always, dramatiq-rabbitmq, huey,"
            " huey-fsync, persist-queue, pgqueuer, postgres, procrastinate, rq,"
            " rq-aof-always, rq-aof-everysec, rq-no-persistence, sqlite, taskiq,"
            " taskiq-aof-always, walqueue, nor package.module:factory",
        ),
        ("no_such_module:factory", "cannot import no_such_module"),
        ("tiny_adapter:no_such_factory", "tiny_adapter has no callable no_such_factory"),
        ("tiny_queue:TinyQueue", "TinyQueue() raised TypeError"),
        ("uuid:uuid4", "uuid4() returned UUID, not a crashqueuelab System"),
    ],
)
def test_an_unusable_system_is_a_usage_error(
    tmp_path: Path, spec: str, reason: str, run_cli: RunCli
) -> None:
    with pytest.raises(SystemUnavailable) as caught:
        resolve_system(spec)
    assert reason in str(caught.value)
    outcome = run_cli("campaign", "--system", spec, "--output-directory", str(tmp_path))
    assert outcome.code == cli.EXIT_USAGE
    assert outcome.result["error"]["type"] == "SystemUnavailable"
    assert outcome.result["error"]["spec"] == spec
    assert list(tmp_path.iterdir()) == []


def test_a_module_that_fails_as_it_loads_is_one_line_of_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_cli: RunCli
) -> None:
    (tmp_path / "loads_badly.py").write_text("raise RuntimeError('no queue\\nhere')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemUnavailable) as caught:
        resolve_system("loads_badly:system")
    assert str(caught.value) == (
        "system 'loads_badly:system': cannot import loads_badly: RuntimeError: no queue here"
    )
    outcome = run_cli(
        "campaign", "--system", "loads_badly:system", "--output-directory", str(tmp_path / "c")
    )
    assert outcome.code == cli.EXIT_USAGE
    assert outcome.result["error"]["type"] == "SystemUnavailable"


def test_the_walk_through_adapter_passes_its_campaign(tmp_path: Path, run_cli: RunCli) -> None:
    outcome = run_cli(
        "campaign", "--system", "tiny_adapter:tiny_system", "--seed", "3",
        "--output-directory", str(tmp_path / "c"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_OK, outcome.result["anomalies"]
    assert outcome.result["system"]["name"] == "tinyqueue"
    assert outcome.result["system"]["independent_reader"] is False
    summary = outcome.result["summary"]
    assert (summary["passed"], summary["failed"], summary["probes_failed"]) == (12, 0, 0)
    # No heartbeat, no chained or carried calls: the probes that need them do not apply,
    # and the report says so.
    report = json.loads((tmp_path / "c" / "campaign.json").read_text())
    skipped = [probe for probe in report["probes"] if not probe["ran"]]
    assert skipped == [
        {
            "name": name,
            "ran": False,
            "ok": None,
            "status": "not applicable",
            "detail": f"not applicable: {why}",
        }
        for name, why in (
            ("heartbeat_after_expiry", "no heartbeats"),
            ("heartbeat_survives_restart", "no heartbeats"),
            ("batched_acknowledgement_sees_the_lease_as_it_stands", "no heartbeats"),
            ("self_reports_match_what_holders_were_told", "no heartbeats"),
            ("chained_acknowledgement_is_fenced", "no chained calls"),
            (
                "carried_calls_are_judged_against_the_store",
                "no calls another writer's commit can carry",
            ),
        )
    ]
    case = report["cases"][0]
    assert case["crash_state"]["store"]["judge"].startswith("the system's own client")


def test_the_walk_through_adapter_passes_chaos(tmp_path: Path, run_cli: RunCli) -> None:
    # The faults land in the first 85% of the work, at marks the supervisor counts from the
    # workers' logs. A worker killed between its acknowledgement's commit and the line
    # saying so leaves the store ahead of the logs; the marks count acknowledgements sent,
    # so every planned fault lands even in a short run (300 jobs, 1.3 s on this adapter).
    outcome = run_cli(
        "chaos", "--system", "tiny_adapter:tiny_system", "--seed", "3", "--jobs", "300",
        "--kills", "15", "--pauses", "2", "--lease-ms", "300", "--workers", "3",
        "--output-directory", str(tmp_path / "c"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_OK, outcome.result["reasons"]
    assert outcome.result["accounting"]["succeeded"] == 300
    assert (outcome.result["kills_delivered"], outcome.result["pauses_delivered"]) == (15, 2)
    report = json.loads((tmp_path / "c" / "chaos.json").read_text())
    holding = [f for f in report["faults"] if f["kind"] == "SIGSTOP" and f.get("leases_held")]
    assert outcome.result["pauses_fenced"] == len(holding)


def test_an_unfenced_queue_is_caught_by_the_probes(tmp_path: Path, run_cli: RunCli) -> None:
    outcome = run_cli(
        "campaign", "--system", "broken_adapters:stale_ack_system", "--seed", "3",
        "--shrink-seconds", "0", "--output-directory", str(tmp_path / "c"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_REJECTED
    assert outcome.result["ok"] is False
    assert any(
        line.startswith("probe stale_holder_after_expiry: job stale-holder: an acknowledgement")
        and "was accepted" in line
        for line in outcome.result["anomalies"]
    )


def test_chaos_reports_every_late_acknowledgement_an_unfenced_queue_accepts(
    tmp_path: Path,
    run_cli: RunCli,
) -> None:
    """Whether a paused worker's late acknowledgement lands before another worker redid the
    job is timing (the probes above are the deterministic catch); what chaos sees, it says."""
    outcome = run_cli(
        "chaos", "--system", "broken_adapters:stale_ack_system", "--seed", "3", "--jobs", "300",
        "--kills", "5", "--pauses", "3", "--lease-ms", "300", "--workers", "3",
        "--shrink-seconds", "0",
        "--output-directory", str(tmp_path / "h"),
    )  # fmt: skip
    report = json.loads((tmp_path / "h" / "chaos.json").read_text())
    pauses = [f for f in report["faults"] if f["kind"] == "SIGSTOP" and f.get("leases_held")]
    accepted = sum(f["late_acknowledgements"]["accepted"] for f in pauses)
    late_lines = [
        line for line in outcome.result["anomalies"] if "late acknowledgement accepted" in line
    ]
    assert len(late_lines) == accepted
    assert report["pauses_fenced"] == sum(1 for f in pauses if f["fenced"])
    if accepted or outcome.result["accounting"]["acknowledged_twice"]:
        assert outcome.code == cli.EXIT_REJECTED
        assert report["ok"] is False


def test_a_queue_that_loses_jobs_on_recovery_is_caught(tmp_path: Path, run_cli: RunCli) -> None:
    outcome = run_cli(
        "campaign", "--system", "broken_adapters:losing_system", "--seed", "3",
        "--shrink-seconds", "0", "--output-directory", str(tmp_path / "c"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_REJECTED
    assert outcome.result["summary"]["failed"] >= 1
    assert any(
        "at the crash, missing after recovery" in line for line in outcome.result["anomalies"]
    )
    outcome = run_cli(
        "chaos", "--system", "broken_adapters:losing_system", "--seed", "3", "--jobs", "300",
        "--kills", "15", "--lease-ms", "300", "--workers", "3",
        "--shrink-seconds", "0",
        "--output-directory", str(tmp_path / "h"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_REJECTED
    assert outcome.result["accounting"]["lost"] >= 1
    assert any("missing from the store (lost)" in line for line in outcome.result["anomalies"])


@pytest.mark.slow
def test_a_queue_that_raises_is_reported_and_the_run_stops(tmp_path: Path, run_cli: RunCli) -> None:
    outcome = run_cli(
        "chaos", "--system", "broken_adapters:raising_system", "--seed", "3", "--jobs", "50",
        "--kills", "5", "--output-directory", str(tmp_path / "h"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_REJECTED
    assert "Traceback" not in outcome.stderr
    assert outcome.result["anomalies"][0].endswith("RuntimeError: the queue's claim is broken")
    accounting = outcome.result["accounting"]
    # Every job is still queued: the work stalled, and nothing is said to be lost.
    assert (accounting["lost"], accounting["unfinished"]) == (0, 50)
    assert "unfinished: 50" in outcome.result["reasons"]
    outcome = run_cli(
        "campaign", "--system", "broken_adapters:raising_system", "--seed", "3",
        "--shrink-seconds", "0", "--output-directory", str(tmp_path / "c"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_REJECTED
    assert "Traceback" not in outcome.stderr
    assert any("the system raised RuntimeError" in line for line in outcome.result["anomalies"])


def test_two_live_leases_on_one_job_fail_chaos_though_nothing_is_acknowledged_twice(
    tmp_path: Path,
    run_cli: RunCli,
) -> None:
    """A claim in two steps without exclusion: fencing refuses the first holder's late
    acknowledgement, so nothing is lost or acknowledged twice; the workers' logs prove the
    two live leases all the same."""
    outcome = run_cli(
        "chaos", "--system", "broken_adapters:racy_claim_system", "--seed", "1", "--jobs", "600",
        "--kills", "20", "--pauses", "1", "--lease-ms", "500", "--workers", "3",
        "--shrink-seconds", "0",
        "--output-directory", str(tmp_path / "c"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_REJECTED
    accounting = outcome.result["accounting"]
    assert (accounting["lost"], accounting["acknowledged_twice"]) == (0, 0)
    assert accounting["overlapping_leases"] > 0
    assert any(reason.startswith("second leases granted while another was live: ")
               for reason in outcome.result["reasons"])  # fmt: skip
    assert "two live leases from " in accounting["overlapping_lease_proofs"][0]


def test_the_showcase_takes_an_outside_system_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_cli: RunCli
) -> None:
    from crashqueuelab.lab import showcase
    from crashqueuelab.lab.mutants.catalog import MUTANTS

    # The mutants are the shipped systems' planted bugs, whatever system the showcase is
    # given; one of them is enough here (test_mutants runs them all).
    monkeypatch.setattr(showcase, "MUTANTS", [MUTANTS[0]])
    outcome = run_cli(
        "showcase", "--system", "tiny_adapter:tiny_system", "--seed", "2",
        "--output-directory", str(tmp_path / "s"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_OK, outcome.result
    assert list(outcome.result["systems"]) == ["tiny_adapter:tiny_system"]
    section = outcome.result["systems"]["tiny_adapter:tiny_system"]
    assert section["system"]["name"] == "tinyqueue"
    assert outcome.result["process_fault_campaign"] == section["process_fault_campaign"]
    assert section["effect_commit_before_acknowledgement"]["durable_effects"] == {
        "idempotent": 1,
        "non_idempotent": 2,
    }
    assert (tmp_path / "s" / "tiny_adapter-tiny_system" / "process-fault-campaign").is_dir()
    assert (outcome.result["mutants"]["caught"], outcome.result["mutants"]["total"]) == (1, 1)
    outcome = run_cli(
        "showcase", "--system", "nowhere:nothing", "--output-directory", str(tmp_path / "t")
    )
    assert (outcome.code, outcome.result["error"]["type"]) == (cli.EXIT_USAGE, "SystemUnavailable")
    assert not (tmp_path / "t").exists()


def test_a_system_that_raises_fails_its_bench_cells_without_a_traceback(
    tmp_path: Path, run_cli: RunCli
) -> None:
    outcome = run_cli(
        "bench", "--system", "broken_adapters:raising_system", "--jobs", "10",
        "--workers", "1", "--work-ms", "0", "--output-directory", str(tmp_path / "b"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_REJECTED
    assert outcome.result["ok"] is False
    assert "Traceback" not in outcome.stderr
    assert "FAILED" in outcome.stderr
    report = json.loads((tmp_path / "b" / "bench.json").read_text())
    failed = [cell for cell in report["cells"] if "failed" in cell]
    assert [cell["system"] for cell in failed] == ["tinyqueue-raising-single"]
    assert "RuntimeError: the queue's claim is broken" in failed[0]["failed"]


@pytest.mark.parametrize("command", ["campaign", "chaos", "demo", "showcase", "bench"])
def test_a_system_whose_open_raises_fails_the_run_naming_the_call(
    tmp_path: Path, command: str, run_cli: RunCli
) -> None:
    """Whatever the system under test raises is its failure: ok false, exit 1, the call
    named, the run's JSON and page written, never a traceback nor the lab's own error."""
    directory = tmp_path / command
    sizes = {"chaos": ["--jobs", "50", "--kills", "2", "--pauses", "0"],
             "bench": ["--jobs", "10", "--workers", "1", "--work-ms", "0"]}  # fmt: skip
    outcome = run_cli(
        command, "--system", "broken_adapters:open_raising_system", *sizes.get(command, []),
        "--quiet", "--output-directory", str(directory),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_REJECTED, outcome.result
    assert outcome.result["ok"] is False
    assert "Traceback" not in outcome.stderr
    text = json.dumps(outcome.result)
    assert "raised from open: OSError: [Errno 5] Input/output error" in text
    assert (directory / "report.html").is_file()
    assert any(directory.glob("*.json"))


@pytest.mark.slow
def test_a_system_whose_recovery_raises_fails_chaos_and_the_campaign(
    tmp_path: Path, run_cli: RunCli
) -> None:
    outcome = run_cli(
        "chaos", "--system", "broken_adapters:recover_raising_system", "--jobs", "100",
        "--kills", "2", "--pauses", "0", "--quiet", "--shrink-seconds", "0",
        "--output-directory", str(tmp_path / "c"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_REJECTED
    assert outcome.result["reasons"][0] == (
        "maintenance exited with status 3: RuntimeError: the queue's recovery is broken"
    )
    assert "Traceback" not in outcome.stderr
    outcome = run_cli(
        "campaign", "--system", "broken_adapters:recover_raising_system", "--quiet",
        "--shrink-seconds", "0", "--output-directory", str(tmp_path / "k"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_REJECTED
    assert any("recovery raised RuntimeError: the queue's recovery is broken" in line
               for line in outcome.result["anomalies"])  # fmt: skip


def test_a_declared_crash_point_never_reached_says_so_and_names_the_points_reached(
    tmp_path: Path,
    run_cli: RunCli,
) -> None:
    outcome = run_cli(
        "campaign", "--system", "broken_adapters:unreached_point_system", "--seed", "3",
        "--shrink-seconds", "0", "--output-directory", str(tmp_path / "c"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_REJECTED
    [line] = [line for line in outcome.result["anomalies"] if "compact:after" in line]
    assert "crash point compact:after was never reached: the workload ran to its end" in line
    assert "in order: submit:before, submit:after, claim:before, claim:after" in line
    assert "crash state" not in line  # the final state of a finished workload proves nothing
    report = json.loads((tmp_path / "c" / "campaign.json").read_text())
    [case] = [case for case in report["cases"] if case["fault_point"] == "compact:after"]
    assert case["points_reached"][:2] == ["submit:before", "submit:after"]
    assert all(c["points_reached"] is None for c in report["cases"] if c["died_at_fault_point"])


class _HeartbeatRaisingClient(SqliteClient):
    def heartbeat(self, claim: Claim, lease_us: int) -> bool:
        raise RuntimeError("the queue's heartbeat is broken")


def heartbeat_raising_system() -> System:
    """sqlite, but every heartbeat raises."""

    def open_raising(request: OpenRequest) -> QueueClient:
        client = sqlite_system().open(request)
        assert isinstance(client, SqliteClient)
        return _HeartbeatRaisingClient(client.queue)

    return replace(sqlite_system(), name="sqlite-heartbeat-raising", open=open_raising)


def test_a_heartbeat_that_raises_in_a_crash_child_is_named_in_its_case(
    tmp_path: Path, run_cli: RunCli
) -> None:
    outcome = run_cli(
        "campaign", "--system", "tests.systems.test_systems:heartbeat_raising_system",
        "--crash-point", "AFTER_HEARTBEAT_COMMIT", "--probe", "idempotent_submit", "--seed", "3",
        "--shrink-seconds", "0", "--output-directory", str(tmp_path / "c"),
    )  # fmt: skip
    assert outcome.code == cli.EXIT_REJECTED, outcome.result
    (reason,) = outcome.result["reasons"]
    assert reason.startswith("case 01-after-heartbeat-commit: exit 1")
    assert (
        "the system under test (sqlite-heartbeat-raising) raised from heartbeat:"
        " RuntimeError: the queue's heartbeat is broken" in reason
    )
    assert "never reached" not in reason


def test_a_system_is_handed_absolute_directories_whatever_the_run_was_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An adapter may make a URI of its directory (Path.as_uri refuses a relative one): the
    # documented commands name their output directories relative to the working directory.
    from crashqueuelab.core.clock import ManualClock
    from crashqueuelab.core.ids import SeededIds
    from crashqueuelab.core.retry import RetryPolicy
    from crashqueuelab.lab.runs.readings import read_store
    from crashqueuelab.systems.contract import StoreReading

    monkeypatch.chdir(tmp_path)
    request = OpenRequest(Path("runs/store"), ManualClock(0), SeededIds(0, "t"), RetryPolicy())
    assert request.directory == tmp_path / "runs" / "store"
    seen: list[Path] = []

    def reader(directory: Path) -> StoreReading:
        seen.append(directory)
        return StoreReading(True, {}, {}, True, (), "a reader that notes its directory")

    reading = read_store(replace(sqlite_system(), reader=reader), Path("runs/store"), [])
    assert (reading.ok, seen) == (True, [tmp_path / "runs" / "store"])
