"""The pytest plugin: nothing without its option; with it, the lab's checks on the named
system, each failure in the lab's words with where its evidence is kept."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Imported here, so that pytester's in-process runs (which forget every module a run
# imported) share one copy of the lab: a crash child's function must be the one its fork
# server pickles, and a run does not import the lab again.
import crashqueuelab.suite.session  # noqa: F401
from crashqueuelab.core.errors import CrashModeUnavailable, ServerUnavailable
from crashqueuelab.lab.campaign.probes import PROBES
from crashqueuelab.servers.redis import SOCKET_VARIABLE, ThrowawayRedis
from crashqueuelab.suite.behaviour import CHECKS
from crashqueuelab.suite.checks import lab_checks, what_failed
from crashqueuelab.suite.selection import node_id, split_arguments
from crashqueuelab.systems.registry import resolve_system
from tests.conftest import EXAMPLES

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def examples_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))


def test_without_its_option_the_plugin_adds_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mine="def test_mine() -> None:\n    pass\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_a_correct_system_passes_every_check_that_applies(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mine="def test_mine() -> None:\n    pass\n")
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "-rs", "--crashqueuelab-system", "tiny_adapter:tiny_system"
    )
    system = resolve_system("tiny_adapter:tiny_system")
    capabilities = system.capabilities.to_json()
    skipped = sum(check.not_for(system.capabilities) is not None for check in CHECKS)
    skipped += sum(needs is not None and not capabilities[needs] for _, _, needs in PROBES)
    total = len(CHECKS) + len(PROBES) + len(system.crash_points) + 1
    result.assert_outcomes(passed=1 + total - skipped, skipped=skipped)
    result.stdout.fnmatch_lines(["*the system declares no heartbeats*"])


def test_a_broken_system_fails_in_the_lab_s_words(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "-k", "probe or at_the_deadline",
        "--crashqueuelab-system", "broken_adapters:stale_ack_system",
    )  # fmt: skip
    outcomes = result.parseoutcomes()
    assert outcomes["failed"] == 5, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*contract check an_acknowledgement_at_the_deadline_is_refused failed (evidence in *",
            # What the system did and what it must do, in the lab's words.
            "an acknowledgement exactly at the lease's deadline answered succeeded; it must"
            " answer stale (a lease is live strictly before its deadline)",
            "*1 anomaly (evidence in *",
            "*- probe stale_holder_after_expiry: job stale-holder: an acknowledgement after*",
        ],
        consecutive=False,
    )


OPTION = "--crashqueuelab-system"
TINY = "tiny_adapter:tiny_system"
BROKEN = "broken_adapters:stale_ack_system"
#: The argument that names the lab's checks (and nothing of the project's own).
LAB = "crashqueuelab"


def _tiny_counts() -> tuple[int, int]:
    """How many checks the lab has on the tiny adapter, and how many of them are skipped."""
    system = resolve_system(TINY)
    capabilities = system.capabilities.to_json()
    skipped = sum(check.not_for(system.capabilities) is not None for check in CHECKS)
    skipped += sum(needs is not None and not capabilities[needs] for _, _, needs in PROBES)
    return len(CHECKS) + len(PROBES) + len(system.crash_points) + 1, skipped


def _a_project_with_its_own_suite(pytester: pytest.Pytester, test_mine: str) -> None:
    """A project whose ``testpaths`` collect a suite of its own, as this repository's do."""
    pytester.makeini("[pytest]\ntestpaths = tests\n")
    pytester.mkdir("tests")
    pytester.makepyfile(**{"tests/test_mine": test_mine})


def test_naming_the_lab_runs_only_its_checks_beside_a_project_s_testpaths(
    pytester: pytest.Pytester,
) -> None:
    # The project's own suite cannot even be collected here: the lab's command must not try.
    _a_project_with_its_own_suite(pytester, "import not_installed_here\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", LAB, OPTION, TINY)
    total, skipped = _tiny_counts()
    result.assert_outcomes(passed=total - skipped, skipped=skipped)
    result.stdout.fnmatch_lines([f"collected {total} items"])
    result.stdout.no_fnmatch_line("*not_installed_here*")


@pytest.mark.parametrize("paths", [[], ["tests"]], ids=["testpaths", "a path"])
def test_the_lab_s_checks_join_a_project_s_own_tests_and_are_counted(
    pytester: pytest.Pytester, paths: list[str]
) -> None:
    _a_project_with_its_own_suite(pytester, "def test_mine() -> None:\n    pass\n")
    total, skipped = _tiny_counts()
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", *paths, OPTION, TINY)
    result.assert_outcomes(passed=1 + total - skipped, skipped=skipped)
    result.stdout.fnmatch_lines([f"collected {1 + total} items", "tests/test_mine.py .*"])


def _one_line_usage_error(result: pytest.RunResult) -> str:
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    said = [line for line in result.stdout.lines + result.stderr.lines if line.strip()]
    assert len(said) == 1, said
    return said[0]


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("nosuch:thing", "cannot import nosuch: No module named 'nosuch'"),
        ("raises_on_import:system", "cannot import raises_on_import: RuntimeError: no queue"),
        ("tiny_adapter:no_such_factory", "tiny_adapter has no callable no_such_factory"),
        ("tiny_queue:TinyQueue", "TinyQueue() raised TypeError"),
        ("uuid:uuid4", "uuid4() returned UUID, not a crashqueuelab System"),
        ("oracle", "not one of arq, arq-aof-always, celery, celery-acks-late, "),
        # Only its own worker consumes (as Celery's on RabbitMQ): the plugin's checks claim
        # through the adapter.
        ("own_worker_only:system", "only the library's own worker consumes from "),
    ],
)
def test_a_system_the_lab_cannot_use_is_one_line_of_usage_error(
    pytester: pytest.Pytester, spec: str, reason: str
) -> None:
    pytester.makepyfile(raises_on_import="raise RuntimeError('no queue\\nhere')\n")
    pytester.makepyfile(
        own_worker_only="""
import dataclasses

from crashqueuelab.systems import resolve_system


def system():
    sqlite = resolve_system("sqlite")
    return dataclasses.replace(
        sqlite, capabilities=dataclasses.replace(sqlite.capabilities, claims=False)
    )
"""
    )
    pytester.syspathinsert()
    said = _one_line_usage_error(
        pytester.runpytest_inprocess("-p", "no:cacheprovider", LAB, OPTION, spec)
    )
    assert said.startswith(f"ERROR: system {spec!r}: "), said
    assert reason in said, said
    if spec == "own_worker_only:system":
        assert said.endswith(
            "the pytest plugin claims through the lab's adapter; run it under `deploys`"
        )


def test_a_crash_mode_the_lab_cannot_make_is_one_line_of_usage_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    unknown = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", LAB, OPTION, TINY, "--crashqueuelab-crash-mode", "flood"
    )  # fmt: skip
    said = _one_line_usage_error(unknown)
    assert (
        said == "ERROR: --crashqueuelab-crash-mode flood: 'flood' is not one of process, power-loss"
    )
    # The campaign's failover mode needs a replicated server the command line starts.
    failover = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", LAB, OPTION, TINY, "--crashqueuelab-crash-mode", "failover"
    )  # fmt: skip
    assert _one_line_usage_error(failover).endswith("'failover' is not one of process, power-loss")

    def no_fuse() -> None:
        raise CrashModeUnavailable("power-loss", "/dev/fuse is missing")

    monkeypatch.setattr("crashqueuelab.lab.faults.crashmodes.require_power_loss", no_fuse)
    unavailable = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", LAB, OPTION, TINY, "--crashqueuelab-crash-mode", "power-loss"
    )  # fmt: skip
    said = _one_line_usage_error(unavailable)
    assert said == "ERROR: --crashqueuelab-crash-mode power-loss: /dev/fuse is missing"


def test_a_contract_check_s_failure_says_what_it_was_told() -> None:
    told = AssertionError("w1 found nothing to claim")
    assert what_failed(told) == "w1 found nothing to claim"
    # Without a message, the statement that failed and where.
    with pytest.raises(AssertionError) as bare:
        exec(compile("assert 1 == 2", "rule.py", "exec"))  # a bare assert, never rewritten
    assert what_failed(bare.value) == "assert (rule.py, line 1)"


def test_a_node_id_the_lab_does_not_have_is_one_line_of_usage_error(
    pytester: pytest.Pytester,
) -> None:
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", f"{LAB}::probe::no_such_probe", OPTION, TINY
    )
    said = _one_line_usage_error(result)
    assert f"not found: {LAB}::probe::no_such_probe" in said, said


def test_every_collected_node_id_names_that_item_alone(pytester: pytest.Pytester) -> None:
    listed = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "--collect-only", "-q", LAB, OPTION, TINY
    )  # fmt: skip
    node_ids = [line for line in listed.outlines if "::" in line]
    checks = lab_checks(TINY, resolve_system(TINY), seed=7, crash_mode="process")
    assert node_ids == [node_id(check.parts) for check in checks]
    for each in node_ids:
        selection, rest = split_arguments(["tests", each])
        assert rest == ["tests"]
        assert [node_id(c.parts) for c in checks if selection.selects(c.parts)] == [each]
    # A crash point's name has a colon of its own; given back, it is collected alone.
    point = next(each for each in node_ids if "::crash-point::" in each)
    again = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "--collect-only", "-q", point, OPTION, TINY
    )  # fmt: skip
    assert [line for line in again.outlines if "::" in line] == [point]


def test_a_printed_failure_pasted_back_runs_that_failure_alone(pytester: pytest.Pytester) -> None:
    first = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "-k", "probe or at_the_deadline", OPTION, BROKEN
    )
    failed = [line.split()[1] for line in first.outlines if line.startswith("FAILED ")]
    assert len(failed) == 5, first.stdout.str()
    # A contract check and a probe: the two kinds of failure this system has.
    for printed in (failed[0], failed[-1]):
        again = pytester.runpytest_inprocess("-p", "no:cacheprovider", printed, OPTION, BROKEN)
        again.assert_outcomes(failed=1)
        again.stdout.fnmatch_lines(["collected 1 item", f"FAILED {printed}*"])


FIRST_RULE = f"{LAB}::contract::a_key_names_one_job_however_often_it_is_submitted"


def test_a_system_on_a_server_runs_on_the_server_the_environment_names(
    pytester: pytest.Pytester, postgres_dsn: str
) -> None:
    point = resolve_system("postgres").crash_points[0].name
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", FIRST_RULE, f"{LAB}::crash-point::{point}", OPTION, "postgres"
    )  # fmt: skip
    result.assert_outcomes(passed=2)


def test_a_system_on_a_server_nobody_named_gets_one_for_the_session(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, redis_socket: str
) -> None:
    # (redis_socket: Redis can run here.) The environment names none to the session.
    monkeypatch.delenv(SOCKET_VARIABLE)
    # Directly under the system temp directory: a Unix socket's path has a length limit.
    scratch = Path(tempfile.mkdtemp(prefix="plugin-"))
    try:
        monkeypatch.setattr(tempfile, "tempdir", str(scratch))
        result = pytester.runpytest_inprocess(
            "-p", "no:cacheprovider", FIRST_RULE, OPTION, "rq-no-persistence"
        )  # fmt: skip
        result.assert_outcomes(passed=1)
        # Stopped with the session: no longer named, its directory gone with the check's.
        assert SOCKET_VARIABLE not in os.environ
        assert list(scratch.iterdir()) == []
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_a_server_that_cannot_start_is_a_setup_error_never_a_failure(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_redis(persistence: str) -> ThrowawayRedis:
        raise ServerUnavailable("redis-server is not installed", "redis")

    monkeypatch.setattr("crashqueuelab.lab.runs.servers.ThrowawayRedis", no_redis)
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", f"{LAB}::contract", OPTION, "rq-no-persistence"
    )  # fmt: skip
    outcomes = result.parseoutcomes()
    assert outcomes["errors"] > 0, result.stdout.str()
    assert "failed" not in outcomes, outcomes
    assert "passed" not in outcomes, outcomes
    result.stdout.fnmatch_lines(["*ServerUnavailable: redis server: redis-server is not installed"])


def test_what_a_system_raises_fails_its_check_with_where_it_raised(
    pytester: pytest.Pytester,
) -> None:
    rule = f"{LAB}::contract::a_claim_leases_a_ready_job_and_then_nothing_is_left"
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", rule, OPTION, "broken_adapters:raising_system"
    )  # fmt: skip
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*raise RuntimeError*", "E * RuntimeError: the queue's claim is broken"]
    )


def _documented(result: pytest.RunResult, system: str) -> dict[str, str]:
    """Each expected failure a run printed (``-rx``): the check's name, and the weakness
    its reason names first, with the link to the library's own words that follows it."""
    version = resolve_system(system).version
    found = {}
    for line in result.stdout.lines:
        if line.startswith("XFAIL "):
            node, _, reason = line[len("XFAIL ") :].partition(" - ")
            assert reason.startswith(f"as {version} documents: "), line
            found[node.rsplit("::", 1)[-1]] = reason[len(f"as {version} documents: ") :]
    return found


def _as_documented(found: dict[str, str], system: str, expected: dict[str, str]) -> None:
    """``found`` names exactly the checks of ``expected``, each with the weakness whose text
    starts as said there, and that weakness's link."""
    assert sorted(found) == sorted(expected), found
    for check, start in expected.items():
        (weakness,) = [w for w in resolve_system(system).documented if w.what.startswith(start)]
        assert found[check].startswith(f"{weakness.what} ({weakness.source})"), (check, found)


NO_TOKEN = "no token: "


def test_pgqueuer_s_contract_failures_are_expected_as_pgqueuer_documents_them(
    pytester: pytest.Pytester, postgres_dsn: str
) -> None:
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "-rx", f"{LAB}::contract", OPTION, "pgqueuer"
    )  # fmt: skip
    result.assert_outcomes(passed=2, skipped=3, xfailed=6)
    _as_documented(
        _documented(result, "pgqueuer"),
        "pgqueuer",
        {
            "the_live_holder_acknowledges_once": NO_TOKEN,
            "an_expired_holder_is_refused_and_the_job_goes_to_another": NO_TOKEN,
            "an_acknowledgement_at_the_deadline_is_refused": NO_TOKEN,
            "a_heartbeat_extends_a_live_lease_only": NO_TOKEN,
            # Its retry (retry_job) delays on the server's clock, which the lab's does not move.
            "a_failure_waits_its_delay_then_the_dead_letter_takes_it": "a retry's delay runs",
            # concurrency_limit=1: one picked job across every worker, so a busy w1 gets none.
            "a_reopened_store_keeps_every_job_and_lease": "concurrency_limit=1",
        },
    )


def test_procrastinate_s_contract_failures_are_expected_as_it_documents_them(
    pytester: pytest.Pytester, postgres_dsn: str
) -> None:
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "-rx", f"{LAB}::contract", OPTION, "procrastinate"
    )  # fmt: skip
    result.assert_outcomes(passed=4, skipped=3, xfailed=4)
    stalled = "stalled jobs are found by their worker's heartbeat"
    _as_documented(
        _documented(result, "procrastinate"),
        "procrastinate",
        {
            # The live worker's heartbeats keep w1's job, whatever the lab's clock says.
            "an_expired_holder_is_refused_and_the_job_goes_to_another": stalled,
            "a_heartbeat_extends_a_live_lease_only": stalled,
            "an_acknowledgement_at_the_deadline_is_refused": NO_TOKEN,
            "a_failure_waits_its_delay_then_the_dead_letter_takes_it": "a retry waits only",
        },
    )


def test_rq_fails_no_check_and_each_expected_failure_is_what_rq_documents(
    pytester: pytest.Pytester, redis_socket: str
) -> None:
    # (redis_socket: Redis can run here.) Every check, the model workload's seed 7 included.
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "-rx", LAB, OPTION, "rq-aof-always"
    )  # fmt: skip
    result.assert_outcomes(passed=19, skipped=10, xfailed=10)
    ttl = "a job whose worker died is handed back only once its heartbeat TTL"
    _as_documented(
        _documented(result, "rq-aof-always"),
        "rq-aof-always",
        {
            "an_expired_holder_is_refused_and_the_job_goes_to_another": ttl,
            "an_acknowledgement_at_the_deadline_is_refused": NO_TOKEN,
            "a_failure_waits_its_delay_then_the_dead_letter_takes_it": "Retry(max=...)",
            "stale_holder_after_expiry": ttl,
            "acknowledgement_at_the_deadline": NO_TOKEN,
            "expired_attempts_run_out": ttl,
            "batched_acknowledgement_fences_each_item": ttl,
            "dequeue:after": ttl,
            "start:before": ttl,
            "model-workload": NO_TOKEN,
        },
    )


def test_the_litequeue_example_fails_only_its_own_bug_and_each_expected_failure_is_documented(
    pytester: pytest.Pytester,
) -> None:
    """A queue author who copies the example gets a red check only for the broken promise
    (the model workload's: a stale failure report runs a succeeded job again), and each
    contract check or probe litequeue's own docstrings account for as an expected failure
    with those words and their link."""
    spec = "litequeue_adapter:litequeue_system"
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-rx", LAB, OPTION, spec)
    result.assert_outcomes(failed=1, passed=23, skipped=10, xfailed=7)
    assert [line for line in result.stdout.lines if line.startswith("FAILED ")] == [
        line for line in result.stdout.lines if line.startswith("FAILED crashqueuelab::model")
    ]
    no_fencing = "No lease and no fencing: "
    _as_documented(
        _documented(result, spec),
        spec,
        {
            "the_live_holder_acknowledges_once": no_fencing,
            "an_acknowledgement_at_the_deadline_is_refused": no_fencing,
            "an_expired_holder_is_refused_and_the_job_goes_to_another": "A locked message is",
            "a_failure_waits_its_delay_then_the_dead_letter_takes_it": "No retry delay: ",
            "stale_holder_after_expiry": no_fencing,
            "acknowledgement_at_the_deadline": no_fencing,
            "batched_acknowledgement_fences_each_item": no_fencing,
        },
    )
