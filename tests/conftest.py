"""Shared fixtures: a fresh database path, a manual clock, seeded ids, and fingerprints."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import itertools
import json
import os
import shlex
import sqlite3
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest

from crashqueuelab import DurableQueue, ManualClock, RetryPolicy, SeededIds
from crashqueuelab.core.hooks import Hook

START_US = 1_000_000
LEASE_US = 100_000
RETRY = RetryPolicy(base_delay_us=1_000, max_delay_us=8_000)

QueueFactory = Callable[..., DurableQueue]

#: The checkout the tests run from, and the folders of it that tests read.
ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
EXAMPLES = ROOT / "examples"

#: The shrinking budget of the tests that shrink: a cap a quiet machine never reaches, so
#: that a loaded one does not cut a shrink short (how small a reproducer gets is the check;
#: how fast is a benchmark's question, never a test's).
SHRINK_BUDGET_S = 900.0
#: The README's showcase seed: the suite's own showcase runs with it, so the README's
#: figures are checked against a fresh run (tests/test_docs.py).
SHOWCASE_SEED = 20260827
#: Set by scripts/gates.py: the file each failed test is named in as it fails, so a run the
#: gates had to stop part-way still names its failures.
FAILED_TESTS_VARIABLE = "CRASHQUEUELAB_FAILED_TESTS"
#: The environments beside the main one (pyproject.toml's [tool.crashqueuelab.environments]):
#: libraries whose dependencies conflict with the main environment's, and their tests, which
#: scripts/gates.py runs in .venv-<name>.
ENVIRONMENTS: dict[str, dict[str, Any]] = (
    tomllib.loads((ROOT / "pyproject.toml").read_text())
    .get("tool", {})
    .get("crashqueuelab", {})
    .get("environments", {})
)


def _missing(environment: dict[str, Any]) -> list[str]:
    """The modules of ``environment``'s libraries that this environment cannot import."""
    return [name for name in environment["imports"] if importlib.util.find_spec(name) is None]


@functools.cache
def _not_here() -> frozenset[Path]:
    """The test files of the environments whose libraries this one lacks."""
    return frozenset(
        ROOT / test
        for environment in ENVIRONMENTS.values()
        if _missing(environment)
        for test in environment["tests"]
    )


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    """The tests of a library that needs an environment of its own are left out where the
    library is not installed (a plain pytest in .venv): never imported when pytest finds
    them in a directory, deselected when named (``pytest_collection_modifyitems``). The
    summary says so, and which command runs them."""
    return True if collection_path in _not_here() else None


def _in_scope(config: pytest.Config, test: Path) -> bool:
    """Whether the run would have collected ``test``: under one of its paths (or named)
    and not left out with ``--ignore``."""
    ignored = {Path(config.invocation_params.dir, path).resolve() for path in
               config.getoption("ignore") or ()}  # fmt: skip
    if test in ignored:
        return False
    for argument in config.args:
        path = Path(config.invocation_params.dir, argument.split("::")[0]).resolve()
        if test == path or path in test.parents:
            return True
    return False


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    for name, environment in ENVIRONMENTS.items():
        missing = _missing(environment)
        left = [test for test in environment["tests"] if _in_scope(config, ROOT / test)]
        if missing and left:
            terminalreporter.write_line(
                f"left out: {', '.join(left)}: {', '.join(missing)} not installed here"
                f" ({environment['why']}); python3 scripts/gates.py runs them in .venv-{name}"
            )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Named on the command line, a file pytest_ignore_collect leaves out is collected all
    # the same: its tests are deselected here, and the summary says why.
    not_here = _not_here()
    if dropped := [item for item in items if item.path in not_here]:
        items[:] = [item for item in items if item.path not in not_here]
        config.hook.pytest_deselected(items=dropped)
    # Marked by what they need, so a run can leave the showcase-sized ones out by marker;
    # on several workers they share one, where the showcase runs once (before xdist's own
    # hook reads the groups, hence first), and they come first: the longest piece of work
    # starts while the other workers take the rest.
    # The tests that share a module's fixture share a worker too: xdist would otherwise
    # make the fixture (a whole run) again on each worker its tests land on.
    readers = []
    for item in items:
        if "showcase_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.showcase)
            item.add_marker(pytest.mark.xdist_group("showcase"))
            readers.append(item)
        elif (shared := _module_fixture(item)) is not None:
            item.add_marker(pytest.mark.xdist_group(shared))
    # The long tests that mostly wait (marker ``early``) come next: begun late, one would
    # keep its worker busy after the others ran out of work.
    first = {id(item) for item in readers}
    early = [i for i in items if id(i) not in first and i.get_closest_marker("early")]
    first |= {id(item) for item in early}
    items[:] = readers + early + [item for item in items if id(item) not in first]
    _pair_quiet(items)


def _pair_quiet(items: list[pytest.Item]) -> None:
    """The quiet tests' order among themselves (they run on their own, in the quiet part):
    each long one (marker ``early``) followed by a short one. xdist hands each worker a
    run of consecutive tests and lets none be taken from a worker holding two (the one it
    runs and the next), so two long ones side by side in the order would run one after the
    other on one worker while others ran out of work."""
    places = [index for index, item in enumerate(items) if item.get_closest_marker("quiet")]
    quiet = [items[index] for index in places]
    long = [item for item in quiet if item.get_closest_marker("early")]
    short = [item for item in quiet if not item.get_closest_marker("early")]
    paired = [item for pair in itertools.zip_longest(long, short) for item in pair if item]
    for index, item in zip(places, paired, strict=True):
        items[index] = item


def _module_fixture(item: pytest.Item) -> str | None:
    """The first module-scoped fixture ``item`` uses, as ``module::fixture``, or None."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for name in info.names_closure:
        for definition in info.name2fixturedefs.get(name, ()):
            if definition.scope == "module":
                return f"{item.module.__name__}::{name}"  # type: ignore[attr-defined]
    return None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get(FAILED_TESTS_VARIABLE)
    if path and report.failed:
        with open(path, "a", encoding="utf-8") as named:
            named.write(f"{report.nodeid} (in {report.when})\n")


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "queue.sqlite"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START_US)


@pytest.fixture
def make_queue(db_path: Path, clock: ManualClock) -> Iterator[QueueFactory]:
    opened: list[DurableQueue] = []

    def factory(hook: Hook | None = None, stream: str = "test", **options: Any) -> DurableQueue:
        queue = DurableQueue(
            db_path, clock=clock, ids=SeededIds(7, stream), retry=RETRY, hook=hook, **options
        )
        opened.append(queue)
        return queue

    yield factory
    for queue in opened:
        queue.close()


@pytest.fixture
def queue(make_queue: QueueFactory) -> DurableQueue:
    return make_queue()


def fingerprint(path: Path) -> tuple[str, list[str]]:
    """The main file's bytes (hashed) and a logical dump of every row, for 'unchanged' proofs.

    The dump comes from a read-only connection so taking the fingerprint changes nothing.
    """
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "absent"
    if not path.exists():
        return digest, []
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        dump = list(conn.iterdump())
    except sqlite3.DatabaseError:
        dump = ["<not a database>"]
    finally:
        conn.close()
    return digest, dump


#: Turns a store of this schema version into the layout of versions 1 and 2, which kept the
#: attempts in a table of their own that the judges hold against the events (filled with
#: the rows the view gives, so the store is consistent until a test changes it).
STORED_ATTEMPTS = (
    "CREATE TABLE attempt_rows AS SELECT * FROM attempts",
    "DROP VIEW attempts",
    "ALTER TABLE attempt_rows RENAME TO attempts",
    "PRAGMA user_version = 2",
)


def raw(path: Path) -> sqlite3.Connection:
    """A plain connection for tests that tamper with a database on purpose."""
    return sqlite3.connect(path, isolation_level=None)


def populate(queue: DurableQueue, clock: ManualClock) -> dict[str, str]:
    """One job in every state, and one that expired and was promoted; ids by name."""
    ids = {}
    for name in ("RECOVERED", "SUCCEEDED", "DEAD", "RETRY_SCHEDULED", "LEASED", "QUEUED"):
        attempts = 1 if name == "DEAD" else 3
        ids[name] = queue.submit(
            idempotency_key=name, job_type="t", payload={"n": name}, max_attempts=attempts
        ).job.job_id
    assert queue.claim(worker_id="w-RECOVERED", lease_duration_us=LEASE_US) is not None
    clock.advance(LEASE_US)
    assert queue.recover_expired() == [ids["RECOVERED"]]
    clock.advance(RETRY.max_delay_us)
    assert queue.promote_retries() == [ids["RECOVERED"]]
    for name in ("SUCCEEDED", "DEAD", "RETRY_SCHEDULED", "LEASED"):
        claimed = queue.claim(worker_id=f"w-{name}", lease_duration_us=LEASE_US)
        assert claimed is not None
        assert claimed.job.job_id == ids[name]
        job_id, token = ids[name], claimed.lease_token
        if name == "SUCCEEDED":
            queue.heartbeat(
                job_id=job_id, worker_id=f"w-{name}", lease_token=token, lease_duration_us=LEASE_US
            )
            queue.succeed(job_id=job_id, worker_id=f"w-{name}", lease_token=token)
        elif name != "LEASED":
            queue.fail(job_id=job_id, worker_id=f"w-{name}", lease_token=token, error="boom")
    return ids


@pytest.fixture
def populated(queue: DurableQueue, clock: ManualClock) -> dict[str, str]:
    ids = populate(queue, clock)
    queue.close()
    return ids


@pytest.fixture(scope="session")
def showcase_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, object], Path]:
    """One showcase (the README's seed, ``SHOWCASE_SEED``) for every test that reads one: it
    runs both crash modes on both shipped systems and the mutant pass, so each extra run
    costs a minute.

    It runs as the README runs it: the command line in a process of its own, outside any
    coverage measurement of the suite's (``unmeasured_cli``). What it reaches is measured
    where the suite's smaller runs reach it (the showcase without power loss, the
    campaigns, the mutants, the exports); measured, this one run cost the suite about a
    tenth of its CPU.

    Its readers share one worker when the tests run on several (``xdist_group``); should
    another worker need it all the same, it waits for the first one's run and reads it,
    under a lock in the directory every worker of the session shares."""
    import fcntl
    import json

    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "showcase-run"
    shared.mkdir(exist_ok=True)
    target, kept = shared / "showcase", shared / "outcome.json"
    with (shared / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not kept.exists():
            seed = str(SHOWCASE_SEED)
            run = unmeasured_cli(
                "showcase", "--seed", seed, "--quiet", "--output-directory", target,
                limit_s=SHOWCASE_LIMIT_S,
            )  # fmt: skip
            kept.write_text(json.dumps({"code": run.code, "summary": run.result}))
        outcome = json.loads(kept.read_text())
    return int(outcome["code"]), dict(outcome["summary"]), target


#: What the session's showcase may take before it is stopped: a backstop far above the
#: minutes it takes on a loaded 2-core machine, never a target.
SHOWCASE_LIMIT_S = 1800.0
#: The variables through which coverage measures the subprocesses of a measured process.
COVERAGE_VARIABLES = ("COVERAGE_PROCESS_CONFIG", "COVERAGE_PROCESS_START")


def unmeasured_cli(*argv: str | Path, limit_s: float) -> CliRun:
    """The command line (``python -m crashqueuelab``) in a process group of its own, with
    no coverage measurement (this process's variables less ``COVERAGE_VARIABLES``), as a
    ``CliRun``. Past ``limit_s`` its group is SIGTERMed (the command stops its runs
    cleanly), then SIGKILLed, and the test fails saying so."""
    import signal
    import subprocess
    import sys

    words = [str(arg) for arg in argv]
    env = {key: value for key, value in os.environ.items() if key not in COVERAGE_VARIABLES}
    with subprocess.Popen(
        [sys.executable, "-m", "crashqueuelab", *words],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    ) as process:  # fmt: skip
        try:
            stdout, stderr = process.communicate(timeout=limit_s)
        except subprocess.TimeoutExpired:
            for signum, grace_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(process.pid, signum)
                except ProcessLookupError:
                    break
                try:
                    process.communicate(timeout=grace_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
            raise AssertionError(
                f"crashqueuelab {shlex.join(words)} ran past {limit_s:.0f} s"
            ) from None
    return _cli_run(words, process.returncode, stdout, stderr)


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """A throwaway PostgreSQL server for the session, named to children by the environment.

    Skips only where no server can exist here (no binaries); CI installs and runs it.
    """
    from crashqueuelab.servers.postgres import ThrowawayServer
    from tests.servers.session import session_server

    yield from session_server(ThrowawayServer, "PostgreSQL")


@pytest.fixture(scope="session")
def redis_socket() -> Iterator[str]:
    """A throwaway Redis server for the session (Redis's default persistence), named to
    children by the environment.

    Skips only where no server can exist here (no redis-server); CI installs it.
    """
    from crashqueuelab.servers.redis import ThrowawayRedis
    from tests.servers.session import session_server

    yield from session_server(ThrowawayRedis, "Redis")


@pytest.fixture
def release_cache(monkeypatch: pytest.MonkeyPatch) -> Path:
    """The cache of library release environments that every run of the suite shares: the
    lab's own (``$CRASHQUEUELAB_CACHE``, else under ``~/.cache``), outside the working tree,
    so each release is built once per Python and reused by the next run."""
    from crashqueuelab.lab.versions.environments import CACHE_VARIABLE, cache_root

    root = cache_root()
    monkeypatch.setenv(CACHE_VARIABLE, str(root))
    return root


@dataclass(frozen=True)
class CliRun:
    """One run of the command line in this process (see ``run_cli``)."""

    code: int
    result: dict[str, Any]
    stderr: str


class RunCli(Protocol):
    def __call__(self, *argv: str | Path) -> CliRun: ...


def invoke_cli(*argv: str | Path) -> CliRun:
    # The callable the run_cli fixture returns (documented there), importable for the
    # module-scoped fixtures and module-level helpers that cannot take the fixture.
    from crashqueuelab import cli

    words = [str(arg) for arg in argv]
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(words, stdout=out, stderr=err)
    return _cli_run(words, code, out.getvalue(), err.getvalue())


def _cli_run(words: list[str], code: int, stdout: str, stderr: str) -> CliRun:
    """A run of the command line whose stdout must be exactly one JSON object."""
    try:
        result = json.loads(stdout)
    except ValueError as error:
        problem = str(error)
    else:
        if isinstance(result, dict):
            return CliRun(code, result, stderr)
        problem = f"it holds a {type(result).__name__}"
    raise AssertionError(
        f"crashqueuelab {shlex.join(words)} exited {code} and its stdout is not one JSON"
        f" object ({problem})\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
    )


@pytest.fixture
def run_cli() -> RunCli:
    """Runs the command line in this process: ``run_cli(*argv)`` calls ``cli.main`` with
    ``argv`` (paths as strings) and its stdout and stderr captured, and returns a frozen
    ``CliRun``: ``code``, the exit code; ``result``, stdout, which must be exactly one JSON
    object (anything else raises AssertionError showing stdout and stderr); and ``stderr``.

    Module-scoped fixtures and module-level helpers, which cannot take a function-scoped
    fixture, import the same callable instead: ``from tests.conftest import invoke_cli``.
    """
    return invoke_cli
