"""Every test and quality gate, from a fresh clone with only python3 (>= 3.11) on PATH.

    python3 scripts/gates.py                       # all gates, in .venv
    python3 scripts/gates.py --pytest-only --python /path/to/python3.13
    python3 scripts/gates.py --pytest-only --skip-marked showcase --python ...

It makes (or reuses) a virtual environment, installs the project with its dev extra, then
runs: pytest with branch coverage >= 95% and ResourceWarning as an error, ruff check,
ruff format --check, mypy --strict, python -m build, and the built wheel installed into a
clean virtual environment running a real submit/claim/succeed/check round trip, then its
pytest plugin (with pytest installed beside it) on the example adapters.

pytest runs in two parts: every test not marked ``quiet`` on several workers at once
(pytest-xdist; the tests that read the session's showcase run share one worker, so it runs
once), then the ``quiet`` ones (timing-sensitive: wall-clock timers against heartbeats),
six at a time, on a machine nothing else of the suite is using. The tests of libraries
whose dependencies conflict with the main environment's (pyproject.toml's
``[tool.crashqueuelab.environments]``: arq, which requires redis-py < 6) run in an
environment of their own beside it (``.venv-redis5``), made, type-checked and tested beside
the parallel part; the main run leaves them out. Coverage adds up over every part in both
environments. Every test's time goes to a file kept after the run (``DURATIONS``), slowest
first.

Whatever happens (a failed gate, a gate that overruns its limit, Ctrl-C or SIGTERM), it ends
with the gate summary: each gate PASS or FAIL with its time and why, and the tests that
failed by name. Every gate runs in a process group of its own under one scratch directory
(its TMPDIR: pytest's temporary files, coverage's data files, the servers and mounts the
tests start); at the end anything still running or mounted there is stopped and named, and
the directory is removed, so a run leaves nothing behind. Stdlib only, so it runs before
anything is installed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parent.parent
#: The main environment's extras: every library the lab drives but those of ``APART``.
EXTRAS = (
    "dev", "peers", "reports", "powerloss", "postgres", "pgqueuer", "procrastinate", "rq",
    "dramatiq", "taskiq",
)  # fmt: skip
#: A pip step may not wait on a registry for ever.
INSTALL_LIMIT_S = 900
#: What each gate may take before it is stopped and named as overrun: a backstop well above
#: what it takes on an idle 2-core machine (README), never a target. pytest's is for both
#: its parts: about 1,000 s idle, and a run on a busy host took 1,079 s for the parallel
#: part alone, leaving the quiet part too little under the 1,500 s it had before.
PYTEST_LIMIT_S = 2100
TOOL_LIMIT_S = 600
#: How many tests run at once in the parallel part: the suite's tests mostly wait on the
#: processes and servers they start, so more workers than cores keep the cores busy. Under
#: coverage, one more than the cores does; unmeasured (another Python's fast part), the
#: processes need less CPU and the tests wait more: with one more than the cores, 3.12's
#: fast part kept its 2 cores 58% busy (461.6 s), with three more 96% (385.5 s), measured.
WORKERS_VARIABLE = "CRASHQUEUELAB_TEST_WORKERS"
#: The timing-sensitive tests: they run after the others, with nothing else of the suite.
QUIET = "quiet"
#: How many quiet tests run at once: they wait on wall-clock timers and use little CPU (the
#: five of them before pgqueuer #630 joined, 19.5 CPU-seconds in 139 s, measured). xdist
#: gives each worker a run of consecutive tests and takes none back from a worker holding
#: two (the one it runs and the next), so the long ones (marker ``early``) are each followed
#: by a short one (tests/conftest.py), and six workers leave the longest (#630, about 95 s
#: with its two releases side by side) alone and each other long one with one short one.
QUIET_WORKERS = 6
#: Kept after the run (the scratch directory is not): every test's time, slowest first, and
#: the temporary directories of the tests that failed (``failed-VERSION``).
DURATIONS = Path(tempfile.gettempdir()) / "crashqueuelab-gates"
#: A file larger than this in a failed test's directory is left out of what is kept.
KEPT_FILE_BYTES = 20 * 1024 * 1024
#: How many of the slowest tests the summary names.
SLOWEST = 15
#: How long a stopped process group gets between SIGTERM and SIGKILL.
GRACE_S = 10.0
#: The file the test suite names each failed test in as it happens (tests/conftest.py), so a
#: run that is stopped part-way still names them.
FAILURES_VARIABLE = "CRASHQUEUELAB_FAILED_TESTS"
EXIT_INTERRUPTED = 130
#: pytest's options in every gate: no cache directory in the working tree.
PYTEST = ("-q", "-p", "no:cacheprovider")


class Interrupted(Exception):
    """SIGINT or SIGTERM reached the gates."""


@dataclass(frozen=True)
class Apart:
    """An environment beside the main one, for libraries whose dependencies conflict with
    it: its extras, the modules that show it installed, the sources type-checked there
    against those libraries' own types, and the tests that run there and only there."""

    name: str
    extras: tuple[str, ...]
    imports: tuple[str, ...]
    sources: tuple[str, ...]
    tests: tuple[str, ...]

    def venv(self, main: Path) -> Path:
        """Beside ``main``, named for it: ``.venv-redis5`` beside ``.venv``,
        ``.venv-redis5-3.13`` beside ``.venv-3.13``, ``env-redis5`` beside ``env``."""
        if main.name.startswith(".venv"):
            return main.with_name(main.name.replace(".venv", f".venv-{self.name}", 1))
        return main.with_name(f"{main.name}-{self.name}")


def _apart() -> tuple[Apart, ...]:
    """pyproject.toml's ``[tool.crashqueuelab.environments]``, one ``Apart`` each."""
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found = table.get("tool", {}).get("crashqueuelab", {}).get("environments", {})
    return tuple(
        Apart(name, *(tuple(entry[key]) for key in ("extras", "imports", "sources", "tests")))
        for name, entry in found.items()
    )


#: Every environment beside the main one.
APART = _apart()


def _log(message: str) -> None:
    print(f"[gates] {message}", file=sys.stderr, flush=True)


@dataclass
class Result:
    name: str
    ok: bool
    seconds: float
    why: str = ""
    failed_tests: list[str] = field(default_factory=list)


@dataclass
class Scratch:
    """One run's scratch directory: every gate's TMPDIR, removed at the end."""

    root: Path

    @classmethod
    def make(cls) -> Scratch:
        # Short, under the system's temp directory: Unix socket paths of the servers the
        # tests start must stay under 108 bytes. Traversable by the PostgreSQL account.
        root = Path(tempfile.mkdtemp(prefix="cql-gates-"))
        root.chmod(0o755)
        (root / "tmp").mkdir(mode=0o755)
        (root / "tmp").chmod(0o755)
        return cls(root)

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    def basetemp(self, part: str) -> Path:
        """Where one pytest run of the gates keeps its tests' temporary directories: its
        own, so that no later run removes them (pytest removes every numbered directory
        but the newest under ``pytest-of-USER`` when a run starts, also a failed one's)."""
        return self.tmp / f"pytest-{part}"

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["TMPDIR"] = str(self.tmp)
        # Coverage's data files (one per measured subprocess) go here, never into the tree.
        env["COVERAGE_FILE"] = str(self.root / ".coverage")
        env[FAILURES_VARIABLE] = str(self.root / "failed-tests.txt")
        # The tools' own caches too: nothing is written into the working tree.
        env["HYPOTHESIS_STORAGE_DIRECTORY"] = str(self.root / "hypothesis")
        env["MYPY_CACHE_DIR"] = str(self.root / "mypy-cache")
        env["RUFF_CACHE_DIR"] = str(self.root / "ruff-cache")
        # Compiled modules go to the scratch directory too, never beside the sources, and
        # are written: every test starts Python processes (crash children, workers, the
        # command line) that import the lab, and one that compiles it from source each time
        # (PYTHONDONTWRITEBYTECODE, where the host sets it) pays about 0.3 CPU-seconds more
        # for the command line's imports alone.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(self.root / "pycache")
        return env

    def failed_tests(self) -> list[str]:
        path = self.root / "failed-tests.txt"
        if not path.is_file():
            return []
        return list(dict.fromkeys(line for line in path.read_text().splitlines() if line))

    def sweep(self) -> list[str]:
        """Stop every process and unmount every file system still using the scratch
        directory; what was found, one line each (empty when the tests cleaned up)."""
        found: list[str] = []
        prefix = str(self.root)
        for mount in _mounts_under(prefix):
            found.append(f"mount {mount}")
            for command in (["fusermount3", "-u", "-z", mount], ["umount", "-l", mount]):
                if shutil.which(command[0]) and _quiet(command) == 0:
                    break
        # Helpers of the last gate's own children (a fork server, its resource tracker) exit
        # once they see their parent gone: a moment before any is named as left behind.
        deadline = time.monotonic() + GRACE_S
        while _processes_using(prefix) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid, command_line in _processes_using(prefix):
            found.append(f"process {pid}: {command_line[:160]}")
            # SIGQUIT first: a PostgreSQL postmaster then stops its children at once.
            for signum in (signal.SIGQUIT, signal.SIGKILL):
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    break
                if _gone(pid, GRACE_S / 2):
                    break
        return found

    def keep_failed(self, tests: Sequence[str], into: Path) -> list[Path]:
        """Copy the temporary directory pytest kept for each of ``tests`` (as the suite
        names them: ``path::name (in call)``; it keeps those of failed tests only) into
        ``into``, emptied first: the evidence of a failure that happened once, after the
        scratch directory is gone. Sockets, pipes and files over ``KEPT_FILE_BYTES`` are
        left out; the copies made."""
        shutil.rmtree(into, ignore_errors=True)
        if not tests:
            return []
        # pytest names a test's directory after its name, each non-word character an
        # underscore, cut at 30 characters, then a number; xdist's group ("@module::group",
        # at the end, outside any parameters' brackets) is no part of it.
        ids = (re.sub(r"@[^\[\]]*$", "", test.split(" (in ", 1)[0]) for test in tests)
        names = (test_id.rsplit("::", 1)[-1] for test_id in ids)
        prefixes = {re.sub(r"\W", "_", name)[:30] for name in names}
        kept: list[Path] = []
        for found in sorted(self.tmp.glob("pytest-*/**/test_*")):
            name = found.name
            if found.is_symlink() or not found.is_dir() or name.endswith("current"):
                continue
            if any(name.startswith(prefix) and name[len(prefix) :].isdigit()
                   for prefix in prefixes):  # fmt: skip
                target = into / found.parent.name / name
                shutil.copytree(found, target, symlinks=True, ignore=_not_kept)
                kept.append(target)
        return kept

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _not_kept(directory: str, names: list[str]) -> list[str]:
    """What ``keep_failed`` leaves out of ``directory``: all but directories, symbolic
    links and regular files of at most ``KEPT_FILE_BYTES``."""
    left = []
    for name in names:
        path = Path(directory, name)
        if path.is_symlink() or path.is_dir():
            continue
        if not path.is_file() or path.stat().st_size > KEPT_FILE_BYTES:
            left.append(name)
    return left


def _quiet(command: Sequence[str]) -> int:
    try:
        return subprocess.run(command, capture_output=True, check=False, timeout=GRACE_S).returncode
    except (OSError, subprocess.TimeoutExpired):
        return -1


def _mounts_under(prefix: str) -> list[str]:
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return []
    points = [line.split()[1].replace("\\040", " ") for line in lines if len(line.split()) > 1]
    # Deepest first, so a mount inside another one goes before it.
    return sorted((point for point in points if point.startswith(prefix)), reverse=True)


def _processes_using(prefix: str) -> list[tuple[int, str]]:
    """Processes whose command line or working directory is under ``prefix``."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            command_line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if prefix in command_line or cwd.startswith(prefix):
            found.append((int(entry.name), command_line.strip()))
    return found


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _group_members(pgid: int) -> list[tuple[int, str]]:
    """The processes still in process group ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command_line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        # The fields after the command name, which is in parentheses and may hold spaces.
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and int(fields[2]) == pgid:
            found.append((int(entry.name), command_line.strip()))
    return found


#: Every gate's process group still running, whichever thread started it: an interrupt
#: stops them all.
_LIVE: set[subprocess.Popen[bytes]] = set()
_LIVE_LOCK = threading.Lock()
#: Set once the gates are being stopped: a thread's next gate does not start.
_STOPPING = threading.Event()


def _stop_all() -> None:
    with _LIVE_LOCK:
        _STOPPING.set()
        running = list(_LIVE)
    for process in running:
        _stop_group(process)


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """Stop a gate's whole process group: SIGTERM, then SIGKILL after a grace period."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def _run(
    command: Sequence[str | Path],
    *,
    limit_s: float,
    env: dict[str, str] | None = None,
    leftovers: list[str] | None = None,
) -> tuple[int | None, float]:
    """Run ``command`` in a process group of its own; its exit code (None when it overran
    ``limit_s`` and was stopped) and its time. Interrupted propagates after the group
    has been stopped. Processes of the group that outlive a gate that ended by itself are
    named in ``leftovers``, then killed."""
    _log("$ " + " ".join(str(part) for part in command))
    started = time.monotonic()
    code: int | None = None
    with _LIVE_LOCK:
        if _STOPPING.is_set():
            raise Interrupted("the gates being stopped")
        process = subprocess.Popen(
            [str(part) for part in command], cwd=ROOT, env=env, start_new_session=True
        )
        _LIVE.add(process)
    try:
        code = process.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        _stop_group(process)
        code = None
    except Interrupted:
        _stop_group(process)
        raise
    finally:
        # Helpers a gate started (a multiprocessing fork server, its resource tracker) exit
        # once they see their parent gone: give them a moment before naming any as left.
        deadline = time.monotonic() + GRACE_S
        while _group_members(process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        stray = _group_members(process.pid)
        if stray and leftovers is not None and code is not None:
            leftovers.extend(f"process {pid}: {line[:160]}" for pid, line in stray)
        if stray:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        with _LIVE_LOCK:
            _LIVE.discard(process)
    return code, time.monotonic() - started


def _capture(
    command: Sequence[str | Path], *, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        check=False,
        text=True,
        capture_output=True,
        timeout=TOOL_LIMIT_S,
        env=env,
    )


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _prepare_venv(python: str, venv: Path, extras: Sequence[str] = EXTRAS) -> Path | str:
    """The environment's interpreter with the project installed with ``extras``, or why it
    could not be made."""
    if not _venv_python(venv).exists():
        code, _ = _run([python, "-m", "venv", venv], limit_s=INSTALL_LIMIT_S)
        if code != 0:
            return f"could not create a virtual environment at {venv}"
    interpreter = _venv_python(venv)
    pip: list[str | Path] = [interpreter, "-m", "pip", "--disable-pip-version-check", "-q"]
    code, _ = _run([*pip, "install", "-e", f".[{','.join(extras)}]"], limit_s=INSTALL_LIMIT_S)
    if code != 0:
        overran = " (overran its limit)" if code is None else ""
        return f"could not install the project with its extras {', '.join(extras)}{overran}"
    return interpreter


def _wheel_round_trip(python: str, dist: Path, env: dict[str, str]) -> str | None:
    """Install the built wheel alone into a clean venv and drive a real round trip; None
    when it worked, otherwise why not."""
    wheels = sorted(dist.glob("crashqueuelab-*.whl"))
    if len(wheels) != 1:
        return f"expected one wheel in {dist}, found {[w.name for w in wheels]}"
    home = Path(tempfile.mkdtemp(prefix="wheel-", dir=env["TMPDIR"]))
    venv = home / "venv"
    if _run([python, "-m", "venv", venv], limit_s=INSTALL_LIMIT_S, env=env)[0] != 0:
        return "could not create the clean virtual environment"
    pip: list[str | Path] = [_venv_python(venv), "-m", "pip", "--disable-pip-version-check", "-q"]
    if _run([*pip, "install", "--no-deps", wheels[0]], limit_s=INSTALL_LIMIT_S, env=env)[0] != 0:
        return "could not install the wheel"
    cli = venv / "bin" / "crashqueuelab"
    if _capture([cli, "--help"], cwd=home, env=env).returncode != 0:
        return "crashqueuelab --help failed from the installed wheel"
    database = str(home / "queue.sqlite")
    steps = [
        ["submit", "--idempotency-key", "wheel-1", "--job-type", "synthetic.effect",
         "--payload", '{"effect_key":"effect-1","value":7}'],
        ["claim", "--worker-id", "wheel-worker"],
    ]  # fmt: skip
    outputs = []
    for step in steps:
        result = _capture([cli, step[0], "--database", database, *step[1:]], cwd=home, env=env)
        if result.returncode != 0:
            return f"{step[0]} failed: {result.stdout}{result.stderr}"
        outputs.append(json.loads(result.stdout))
    claimed = outputs[1]["claimed"]
    finish = _capture(
        [cli, "succeed", "--database", database, "--job-id", claimed["job"]["job_id"],
         "--worker-id", "wheel-worker", "--lease-token", claimed["lease_token"]],
        cwd=home, env=env,
    )  # fmt: skip
    check = _capture([cli, "check", "--database", database], cwd=home, env=env)
    verdict = json.loads(check.stdout)
    state = json.loads(finish.stdout).get("job", {}).get("state")
    _log(f"wheel round trip: final state {state}, check ok={verdict['ok']}")
    if finish.returncode != 0 or check.returncode != 0 or not verdict["ok"]:
        return f"succeed or check failed: {finish.stdout} {check.stdout}"
    if state != "SUCCEEDED":
        return f"the job ended {state}, not SUCCEEDED"
    return _wheel_plugin(venv, home, env)


def _wheel_plugin(venv: Path, home: Path, env: dict[str, str]) -> str | None:
    """The installed wheel's pytest plugin, with pytest beside it and nothing else, run as
    docs/pytest-plugin.md runs it: the example adapter passes every check of the lab that
    applies, the unfenced one fails some, and every check collected is one that ran."""
    python = _venv_python(venv)
    pip: list[str | Path] = [python, "-m", "pip", "--disable-pip-version-check", "-q"]
    if _run([*pip, "install", "pytest>=8"], limit_s=INSTALL_LIMIT_S, env=env)[0] != 0:
        return "could not install pytest beside the wheel"
    examples = Path(__file__).resolve().parent.parent / "examples"
    with_examples = {**env, "PYTHONPATH": str(examples)}
    # The example adapter, then the unfenced one (the lab must say no to it).
    for spec, fails in {
        "tiny_adapter:tiny_system": False,
        "broken_adapters:stale_ack_system": True,
    }.items():
        result = _capture(
            [python, "-m", "pytest", "-p", "no:cacheprovider", "crashqueuelab",
             "--crashqueuelab-system", spec],
            cwd=home, env=with_examples,
        )  # fmt: skip
        last = (result.stdout.strip().splitlines() or ["(no output)"])[-1]
        _log(f"wheel pytest plugin on {spec}: exit {result.returncode}, {last}")
        why = _plugin_run_is_wrong(result.stdout, result.returncode, fails=fails)
        if why is not None:
            return f"pytest crashqueuelab --crashqueuelab-system {spec}: {why}"
    return None


def _plugin_run_is_wrong(output: str, code: int, *, fails: bool) -> str | None:
    """Why a run of the plugin's checks did not say what it should (None when it did): exit
    1 with failures and no errors when the system ``fails``, else exit 0; as many tests run
    as "collected N items" counted."""
    collected = re.search(r"^collected (\d+) items?$", output, re.MULTILINE)
    if collected is None:
        return "it never said how many tests it collected"
    last = output.strip().splitlines()[-1]
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|error)", last)}
    if sum(counts.values()) != int(collected.group(1)):
        return f"collected {collected.group(1)} tests, ran {sum(counts.values())}"
    if counts.get("error"):
        return f"{counts['error']} of them could not run (errors, not failures)"
    if fails and (code != 1 or not counts.get("failed")):
        return f"exit {code} with {counts.get('failed', 0)} failed: the lab said yes"
    if not fails and code != 0:
        return f"exit {code}: the lab said no"
    return None


class _Gates:
    """Runs gates one after another and keeps their results for the summary."""

    def __init__(self, scratch: Scratch, version: str) -> None:
        self.scratch = scratch
        self.version = version
        self.env = scratch.environment()
        self.results: list[Result] = []
        self.leftovers: list[str] = []
        self.slowest: list[str] = []
        self.durations: Path | None = None
        self.started = time.monotonic()

    def run(
        self,
        name: str,
        command: Sequence[str | Path],
        *,
        limit_s: float,
        env: dict[str, str] | None = None,
    ) -> bool:
        try:
            code, seconds = _run(
                command, limit_s=limit_s, env=env or self.env, leftovers=self.leftovers
            )
        except Interrupted:
            self.results.append(Result(name, False, 0.0, "interrupted"))
            raise
        why = ""
        if code is None:
            why = f"overran its limit of {limit_s:.0f} s and was stopped"
        elif code != 0:
            why = f"exit status {code}"
        self.results.append(Result(name, code == 0, seconds, why))
        return code == 0

    def note(self, name: str, why: str | None, seconds: float) -> None:
        self.results.append(Result(name, why is None, seconds, why or ""))


def _summary(gates: _Gates, *, version: str, leftovers: list[str]) -> int:
    failed_tests = gates.scratch.failed_tests()
    _log("summary" + (" (CI)" if os.environ.get("CI") else "") + f", python {version}")
    # The tests first, then the tools (which ran beside them), each in the order it ended.
    ordered = sorted(gates.results, key=lambda result: not result.name.startswith("pytest"))
    for result in ordered:
        why = f"  {result.why}" if result.why else ""
        _log(f"  {'PASS' if result.ok else 'FAIL'}  {result.name}  ({result.seconds:.1f} s){why}")
    # Called with none failed too: the last run's directories go, never read as this one's.
    into = DURATIONS / f"failed-{version}"
    kept = gates.scratch.keep_failed(failed_tests, into)
    if failed_tests:
        _log(f"  failed tests ({len(failed_tests)}):")
        for test in failed_tests:
            _log(f"    {test}")
        if kept:
            _log(f"  their temporary directories, kept: {into}")
    if gates.slowest:
        _log(f"  slowest tests (every test's time: {gates.durations}):")
        for line in gates.slowest:
            _log(f"    {line}")
    if leftovers:
        _log(f"  left behind by the tests, stopped now ({len(leftovers)}):")
        for line in leftovers:
            _log(f"    {line}")
    failed = [result.name for result in gates.results if not result.ok]
    if leftovers:
        failed.append("nothing left behind")
    if failed:
        _log(
            f"{len(failed)} gate(s) failed: {', '.join(failed)}"
            f" ({time.monotonic() - gates.started:.0f} s)"
        )
        return 1
    _log(f"all {len(gates.results)} gates passed in {time.monotonic() - gates.started:.0f} s")
    return 0


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    # Once is enough: the stop and the summary that follow must not be cut short.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Interrupted(signal.Signals(signum).name)


def _workers(coverage: bool) -> int:
    configured = os.environ.get(WORKERS_VARIABLE, "")
    if configured.isdigit() and int(configured) > 0:
        return int(configured)
    return (os.cpu_count() or 1) + (1 if coverage else 3)


def _pytest_parts(
    gates: _Gates,
    python: Path,
    *,
    name: str,
    markers: str,
    coverage: bool,
    limit_s: float,
    before_quiet: Callable[[], None] | None = None,
    ignore: Sequence[str] = (),
    quiet_part: bool = True,
) -> bool:
    """The parallel part, then the quiet one (after ``before_quiet`` returns: what else runs
    must end first; without ``quiet_part``, when the quiet tests are left out, it is not
    started), both without the test files ``ignore`` names; with ``coverage``, measured
    across both (and whatever ``before_quiet`` added) and checked against the threshold at
    the end. True when both passed."""
    junit = gates.scratch.root / "junit"
    selected = f"({markers}) and " if markers else ""
    measured = ["--cov", "--cov-branch"] if coverage else []
    left_out = [f"--ignore={path}" for path in ignore]
    workers = _workers(coverage)
    parallel: list[str | Path] = [
        python, "-m", "pytest", *PYTEST, "-m", f"{selected}not {QUIET}",
        "-n", str(workers), "--dist", "loadgroup", f"--junitxml={junit / 'parallel.xml'}",
        f"--basetemp={gates.scratch.basetemp('parallel')}",
        *measured, *(["--cov-report=", "--cov-fail-under=0"] if coverage else []), *left_out,
    ]  # fmt: skip
    started = time.monotonic()
    ok = gates.run(f"{name}: in parallel ({workers} workers)", parallel, limit_s=limit_s)
    quiet: list[str | Path] = [
        python, "-m", "pytest", *PYTEST, "-m", f"{selected}{QUIET}",
        "-n", str(QUIET_WORKERS), "--dist", "worksteal", f"--junitxml={junit / 'quiet.xml'}",
        f"--basetemp={gates.scratch.basetemp('quiet')}",
        *measured, *(["--cov-append", "--cov-report=term-missing"] if coverage else []),
        *left_out,
    ]  # fmt: skip
    if before_quiet is not None:
        before_quiet()
    if not quiet_part:
        _durations(gates, junit)
        return ok
    left = max(60.0, limit_s - (time.monotonic() - started))
    suffix = " + branch coverage >= 95%" if coverage else ""
    ok = (
        gates.run(f"{name}: quiet tests ({QUIET_WORKERS} at once){suffix}", quiet, limit_s=left)
        and ok
    )
    _durations(gates, junit)
    return ok


def _durations(gates: _Gates, junit: Path) -> None:
    """Every test's time from the parts' JUnit files, to a kept file, and the slowest in
    the summary."""
    rows: list[tuple[float, str]] = []
    for part in sorted(junit.glob("*.xml")):
        try:
            tree = ElementTree.parse(part)
        except (OSError, ElementTree.ParseError):
            continue
        for case in tree.iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            rows.append((float(case.get("time") or 0.0), f"{part.stem:8} {name}"))
    if not rows:
        return
    rows.sort(reverse=True)
    DURATIONS.mkdir(parents=True, exist_ok=True)
    kept = DURATIONS / f"durations-{gates.version}.txt"
    total = sum(seconds for seconds, _ in rows)
    lines = [f"# {len(rows)} tests, {total:.1f} s in all (the parts overlap their tests)"]
    kept.write_text("\n".join([*lines, *(f"{s:8.2f} s  {n}" for s, n in rows)]) + "\n")
    gates.slowest = [f"{seconds:7.1f} s  {name}" for seconds, name in rows[:SLOWEST]]
    gates.durations = kept


@dataclass
class _Beside:
    """An environment beside the main one (``Apart``) as one run of the gates makes it, from
    the interpreter ``python``, and tests in it."""

    apart: Apart
    venv: Path
    python: str
    #: Its interpreter, once it is made and the project installed into it.
    interpreter: Path | None = None
    #: Whether its tests selected hold quiet ones (they run once the parallel part is done).
    has_quiet: bool = False

    @property
    def label(self) -> str:
        return f"{self.venv.name} ({', '.join(self.apart.imports)})"

    def coverage_file(self, gates: _Gates) -> Path:
        return gates.scratch.root / f"coverage-{self.apart.name}" / ".coverage"

    def environment(self, gates: _Gates) -> dict[str, str]:
        """The gates' environment but for coverage's data files, which it adds to the main
        run's at the end, and mypy's cache, which is of its packages."""
        self.coverage_file(gates).parent.mkdir(exist_ok=True)
        return {
            **gates.env,
            "COVERAGE_FILE": str(self.coverage_file(gates)),
            "MYPY_CACHE_DIR": str(gates.scratch.root / f"mypy-cache-{self.apart.name}"),
        }

    def pytest(self, gates: _Gates, selection: str, part: str, coverage: bool) -> list[str | Path]:
        assert self.interpreter is not None
        junit = gates.scratch.root / "junit" / f"{part}.xml"
        measured = ["--cov", "--cov-branch", "--cov-append", "--cov-report=", "--cov-fail-under=0"]
        return [
            self.interpreter, "-m", "pytest", *PYTEST, "-m", selection, f"--junitxml={junit}",
            f"--basetemp={gates.scratch.basetemp(part)}", *(measured if coverage else []),
            *self.apart.tests,
        ]  # fmt: skip


def _beside_parallel(
    gates: _Gates, beside: _Beside, *, name: str, markers: str, coverage: bool, typecheck: bool
) -> None:
    """Beside the parallel part: make the environment, type-check its files there against
    its libraries' own types (with ``typecheck``), run its tests not marked quiet (one at a
    time: they are few), and find whether it has quiet ones."""
    started = time.monotonic()
    interpreter = _prepare_venv(beside.python, beside.venv, beside.apart.extras)
    if isinstance(interpreter, str):
        gates.note(f"install into {beside.venv.name}", interpreter, time.monotonic() - started)
        return
    beside.interpreter = interpreter
    _log(f"{beside.venv.name} made and installed in {time.monotonic() - started:.1f} s")
    env = beside.environment(gates)
    if typecheck:
        # Its files alone: the modules they import are checked in the main environment.
        files = [*beside.apart.sources, *beside.apart.tests]
        gates.run(f"mypy --strict: in {beside.label}",
                  [interpreter, "-m", "mypy", "--follow-imports=silent", *files],
                  limit_s=TOOL_LIMIT_S, env=env)  # fmt: skip
    selected = f"({markers}) and " if markers else ""
    # Exit 0 when it collects some, 5 when none.
    listing = _capture(
        [interpreter, "-m", "pytest", *PYTEST, "--collect-only", "-m", f"{selected}{QUIET}",
         *beside.apart.tests],
        cwd=ROOT, env=env,
    )  # fmt: skip
    beside.has_quiet = listing.returncode == 0
    command = beside.pytest(gates, f"{selected}not {QUIET}", beside.apart.name, coverage)
    gates.run(f"{name}: in {beside.label}", command, limit_s=PYTEST_LIMIT_S, env=env)


def _beside_quiet(
    gates: _Gates, beside: _Beside, *, name: str, markers: str, coverage: bool
) -> None:
    """Its quiet tests, if it has any, alone once the parallel part is done."""
    if beside.interpreter is None or not beside.has_quiet:
        return
    selected = f"({markers}) and " if markers else ""
    command = beside.pytest(gates, f"{selected}{QUIET}", f"{beside.apart.name}-quiet", coverage)
    gates.run(f"{name}: quiet tests in {beside.label}", command, limit_s=PYTEST_LIMIT_S,
              env=beside.environment(gates))  # fmt: skip


def _add_coverage(gates: _Gates, python: Path, beside: _Beside) -> None:
    """Its branch coverage added to the main run's, which the quiet part then reports and
    checks: both environments install the same src/ in place, so their paths agree. The
    data file its pytest combined, and beside it those of the helpers (a fork server) that
    ended after pytest had combined."""
    if beside.interpreter is None:
        return  # its install failed, and says so
    data = beside.coverage_file(gates)
    code, seconds = _run([python, "-m", "coverage", "combine", "--append", data, data.parent],
                         limit_s=TOOL_LIMIT_S, env=gates.env)  # fmt: skip
    if code != 0:
        gates.note(f"coverage of {beside.label} added", f"exit status {code}", seconds)


def _start(gates: _Gates, name: str, target: Callable[[], None]) -> threading.Thread:
    """``target`` on a thread of its own, started; when the gates are stopped it ends with
    the gate in flight (the main thread says why), and should it raise, that is a failed
    gate, never a gate missing from the summary."""

    def body() -> None:
        started = time.monotonic()
        try:
            target()
        except Interrupted:
            pass
        except Exception as error:
            gates.note(f"{name}: raised", repr(error), time.monotonic() - started)

    thread = threading.Thread(target=body, name=name)
    thread.start()
    return thread


def _all_gates(
    gates: _Gates,
    python: Path,
    *,
    pytest_only: bool,
    version: str,
    skip: Sequence[str] = (),
    beside: Sequence[_Beside] = (),
) -> None:
    markers = " and ".join(f"not {marker}" for marker in skip)
    left_out = f", without {', '.join(skip)}" if skip else ""
    name = f"pytest (python {version}{left_out})" if pytest_only else "pytest"
    coverage = not pytest_only

    def lane() -> None:
        if not pytest_only:
            _tool_gates(gates, python)
        for environment in beside:
            _beside_parallel(gates, environment, name=name, markers=markers,
                             coverage=coverage, typecheck=not pytest_only)  # fmt: skip

    # The tools need no quiet machine, and the parallel tests leave a core idle much of the
    # time (they wait on the processes and servers they start): the tools run beside them,
    # then each environment beside the main one is made, type-checked and its few tests run,
    # all in one lane (two lanes would double what runs beside the long tests that start
    # first, some of them timing-sensitive); the lane ends before the quiet tests start.
    beside_lane = _start(gates, "beside the parallel part", lane)

    def before_quiet() -> None:
        beside_lane.join()
        for environment in beside:
            _beside_quiet(gates, environment, name=name, markers=markers, coverage=coverage)
            if coverage:
                _add_coverage(gates, python, environment)

    try:
        _pytest_parts(
            gates,
            python,
            name=name,
            markers=markers,
            coverage=coverage,
            limit_s=PYTEST_LIMIT_S,
            before_quiet=before_quiet,
            ignore=[test for environment in beside for test in environment.apart.tests],
            quiet_part=QUIET not in skip,
        )
    except BaseException:
        _stop_all()  # an interrupt: the gate in flight in the lane beside too
        raise
    finally:
        beside_lane.join()


def _tool_gates(gates: _Gates, python: Path) -> None:
    """ruff, ruff format, mypy, the build and the wheel's round trip, one after another."""
    gates.run("ruff check", [python, "-m", "ruff", "check", "."], limit_s=TOOL_LIMIT_S)
    gates.run("ruff format --check", [python, "-m", "ruff", "format", "--check", "."],
              limit_s=TOOL_LIMIT_S)  # fmt: skip
    gates.run("mypy --strict", [python, "-m", "mypy"], limit_s=TOOL_LIMIT_S)
    dist = gates.scratch.root / "dist"
    if gates.run("python -m build", [python, "-m", "build", "--outdir", dist, "."],
                 limit_s=TOOL_LIMIT_S):  # fmt: skip
        started = time.monotonic()
        why = _wheel_round_trip(str(python), dist, gates.env)
        gates.note("wheel in a clean venv: round trip", why, time.monotonic() - started)
    else:
        gates.note("wheel in a clean venv: round trip", "no wheel was built", 0.0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--python", default=sys.executable, help="interpreter to test with")
    parser.add_argument("--venv", default=None, help="virtual environment directory")
    parser.add_argument("--pytest-only", action="store_true", help="run only the test suite")
    parser.add_argument(
        "--skip-marked",
        action="append",
        default=[],
        metavar="MARKER",
        help="with --pytest-only: leave out the tests with this marker (repeatable)",
    )
    args = parser.parse_args(argv)
    if args.skip_marked and not args.pytest_only:
        # The coverage threshold is checked over every test: a gate run leaves none out.
        parser.error("--skip-marked needs --pytest-only")
    version = subprocess.run(
        [args.python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True, text=True, check=False, timeout=60,
    ).stdout.strip()  # fmt: skip
    venv = (
        Path(args.venv)
        if args.venv
        else ROOT / (".venv" if not args.pytest_only else f".venv-{version}")
    )
    beside = [_Beside(apart, apart.venv(venv), args.python) for apart in APART]
    signal.signal(signal.SIGINT, _raise_interrupted)
    signal.signal(signal.SIGTERM, _raise_interrupted)
    scratch = Scratch.make()
    gates = _Gates(scratch, version)
    interrupted = False
    try:
        started = time.monotonic()
        python = _prepare_venv(args.python, venv)
        if isinstance(python, str):
            gates.note("install into the virtual environment", python, time.monotonic() - started)
        else:
            also = "".join(f", {environment.venv} beside it" for environment in beside)
            _log(f"python {version} in {venv}{also}; scratch directory {scratch.root}")
            _all_gates(
                gates,
                python,
                pytest_only=args.pytest_only,
                version=version,
                skip=args.skip_marked,
                beside=beside,
            )
    except Interrupted as signal_name:
        interrupted = True
        _stop_all()  # the tools' gates too, on their own thread
        _log(f"interrupted by {signal_name}: the running gates were stopped")
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        leftovers = gates.leftovers + scratch.sweep()
        code = _summary(gates, version=version, leftovers=leftovers)
        scratch.remove()
    return EXIT_INTERRUPTED if interrupted else code


if __name__ == "__main__":
    sys.exit(main())
