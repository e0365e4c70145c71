"""Ctrl-C and SIGTERM: a run stops its children, servers and mounts, keeps a record with
``interrupted: true`` on stdout and in its directory, ends with one line on stderr (no
traceback), and ``crashqueuelab report DIR`` renders what it had."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab.lab.campaign.diskfaults import STEPS
from crashqueuelab.lab.faults.powerloss.disk import unavailable_reason
from crashqueuelab.lab.runs.interrupts import (
    EXIT_INTERRUPTED,
    Interrupted,
    interruptible,
    start_owned,
)
from tests.conftest import RunCli

#: Every wait below is bounded by this.
LIMIT_S = 120.0


def test_a_signal_inside_interruptible_raises_interrupted_and_the_handlers_come_back() -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    reached = []
    with pytest.raises(Interrupted) as caught, interruptible():  # noqa: PT012
        os.kill(os.getpid(), signal.SIGTERM)
        # The handler runs at the next bytecode boundary: nothing after the kill may.
        reached.append("after the signal")
    assert reached == []
    assert caught.value.signal_name == "SIGTERM"
    assert caught.value.partial == {}
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


class _SignalledWhileStarting:
    """A process whose start is signalled halfway through, as a Ctrl-C can land while the
    lab hands a worker to its fork server."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.steps: list[str] = []

    def start(self) -> None:
        self.steps.append("connected")
        os.kill(os.getpid(), self.signum)
        self.steps.append("sent")


def test_a_signal_while_a_process_starts_interrupts_once_the_start_is_done() -> None:
    process = _SignalledWhileStarting(signal.SIGINT)
    after: list[str] = []
    with pytest.raises(Interrupted) as caught, interruptible():  # noqa: PT012
        start_owned(process)
        after.append("after the start")
    assert process.steps == ["connected", "sent"]
    assert after == []
    assert caught.value.signal_name == "SIGINT"
    # The deferred signal is spent: the next start, signalled by nobody, raises nothing.
    quiet = _SignalledWhileStarting(0)
    start_owned(quiet)
    assert quiet.steps == ["connected", "sent"]


class _FailingOnceSignalled(_SignalledWhileStarting):
    """A start whose fork server went with the signal: it fails after it."""

    def start(self) -> None:
        super().start()
        raise EOFError("the fork server is gone")


def test_a_start_that_fails_while_a_signal_waits_is_the_signals_and_leaves_nothing_pending() -> (
    None
):
    with pytest.raises(Interrupted) as caught, interruptible():
        start_owned(_FailingOnceSignalled(signal.SIGTERM))
    assert caught.value.signal_name == "SIGTERM"
    assert isinstance(caught.value.__cause__, EOFError)
    quiet = _SignalledWhileStarting(0)
    start_owned(quiet)
    assert quiet.steps == ["connected", "sent"]


class _SignalledTwice(_SignalledWhileStarting):
    """A start that hangs after the first signal, until a second one comes."""

    def start(self) -> None:
        super().start()
        os.kill(os.getpid(), self.signum)
        self.steps.append("never reached")


def test_a_second_signal_interrupts_a_start_that_hangs() -> None:
    process = _SignalledTwice(signal.SIGINT)
    with pytest.raises(Interrupted), interruptible():
        start_owned(process)
    assert process.steps == ["connected", "sent"]
    quiet = _SignalledWhileStarting(0)
    start_owned(quiet)
    assert quiet.steps == ["connected", "sent"]


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _interrupt(arguments: list[str], signum: int, directory: Path) -> tuple[int, str, str]:
    """Start ``crashqueuelab ARGUMENTS`` in a process group of its own, wait for its first
    progress line, signal the whole group as a terminal's Ctrl-C does, and collect it."""
    process = subprocess.Popen(
        [sys.executable, "-m", "crashqueuelab", *arguments, "--output-directory", str(directory)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert process.stderr is not None
        with selectors.DefaultSelector() as selector:
            selector.register(process.stderr, selectors.EVENT_READ)
            assert selector.select(timeout=LIMIT_S), "no progress line"
        first = process.stderr.readline().decode()
        os.killpg(process.pid, signum)
        out, err = process.communicate(timeout=LIMIT_S)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=LIMIT_S)
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
    # Workers, crash children and disks were stopped by the run itself; a disk's daemon
    # runs in a session of its own, so it is found by the directory it serves.
    deadline = time.monotonic() + 10
    while (_group_members(process.pid) or _serving(directory)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _group_members(process.pid) == []
    assert _serving(directory) == []
    return process.returncode, out.decode(), first + err.decode()


def _serving(directory: Path) -> list[str]:
    """Processes whose command line names ``directory``, and mounts under it."""
    found = [
        line.split()[1]
        for line in Path("/proc/mounts").read_text().splitlines()
        if str(directory) in line
    ]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(directory) in command:
            found.append(command)
    return found


def _assert_a_readable_interrupted_run(
    code: int, out: str, err: str, directory: Path, run_file: str
) -> dict[str, object]:
    assert code == EXIT_INTERRUPTED
    assert "Traceback" not in err, err
    last = err.rstrip().splitlines()[-1]
    assert last.startswith("crashqueuelab: interrupted: interrupted by SIG"), last
    answer = json.loads(out)
    assert (answer["ok"], answer["interrupted"]) == (False, True)
    kept: dict[str, object] = json.loads((directory / run_file).read_text())
    assert (kept["ok"], kept["interrupted"]) == (False, True)
    rebuilt = subprocess.run(
        [sys.executable, "-m", "crashqueuelab", "report", str(directory)],
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
        check=False,
    )
    assert rebuilt.returncode == 0, rebuilt.stdout
    page = (directory / "report.html").read_text()
    assert "INTERRUPTED" in page
    return kept


def test_chaos_interrupted_by_ctrl_c_keeps_a_record_and_stops_its_workers(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "chaos"
    code, out, err = _interrupt(
        ["chaos", "--jobs", "20000", "--kills", "1000", "--workers", "2"],
        signal.SIGINT,
        directory,
    )
    kept = _assert_a_readable_interrupted_run(code, out, err, directory, "chaos.json")
    assert kept["signal"] == "SIGINT"
    assert isinstance(kept["jobs_acknowledged"], int)
    assert 0 < kept["jobs_acknowledged"] < 20_000
    assert kept["workers_started"]


@pytest.mark.slow
def test_a_power_loss_campaign_interrupted_by_sigterm_unmounts_its_disks(tmp_path: Path) -> None:
    if unavailable_reason() is not None:
        pytest.skip(str(unavailable_reason()))
    directory = tmp_path / "campaign"
    code, out, err = _interrupt(
        ["campaign", "--system", "walqueue", "--crash-mode", "power-loss"],
        signal.SIGTERM,
        directory,
    )
    kept = _assert_a_readable_interrupted_run(code, out, err, directory, "campaign.json")
    assert kept["signal"] == "SIGTERM"
    assert isinstance(kept["cases_done"], int)
    assert 1 <= kept["cases_done"] < kept["cases_planned"]  # type: ignore[operator]
    mounts = Path("/proc/mounts").read_text()
    assert str(directory) not in mounts


_FORKED_CHILD = """
import signal

from crashqueuelab.lab.runs.interrupts import forkserver_context


def report(answers):
    # The first thing the child runs: nothing in it has touched SIGINT yet.
    answers.put(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)


if __name__ == "__main__":
    # As at a terminal, whatever disposition this test's own runner was started with.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    context = forkserver_context(["__main__"])
    answers = context.Queue()
    child = context.Process(target=report, args=(answers,))
    child.start()
    ignored = answers.get(timeout=60)
    child.join(60)
    answers.close()
    answers.join_thread()
    kept = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    print(ignored, kept)
"""


def test_workers_forked_by_the_lab_are_born_ignoring_sigint_and_the_parent_keeps_its_handler(
    tmp_path: Path,
) -> None:
    # A fresh interpreter: this test process may already have a fork server of its own.
    script = tmp_path / "fork_one.py"
    script.write_text(_FORKED_CHILD)
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]


def test_interruptible_does_nothing_outside_the_main_thread() -> None:
    import threading

    seen: list[object] = []

    def body() -> None:
        with interruptible():
            seen.append(signal.getsignal(signal.SIGINT))

    before = signal.getsignal(signal.SIGINT)
    thread = threading.Thread(target=body)
    thread.start()
    thread.join(timeout=LIMIT_S)
    assert seen == [before]


def _interrupting(after: int) -> Callable[..., Any]:
    """A stand-in for one step of a run that raises Interrupted on its call number ``after``
    (counting from 1) and otherwise calls the real step."""
    calls = [0]

    def step(real: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == after:
            raise Interrupted("SIGINT")
        return real(*args, **kwargs)

    return step


@pytest.mark.parametrize("command", ["showcase", "mutants", "bench", "disk-faults"])
def test_every_experiment_keeps_what_it_had_done_when_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, run_cli: RunCli
) -> None:
    """Each run passes Interrupted on with what it had finished; the command line keeps it
    in the run's record, on stdout and on an INTERRUPTED page."""
    from crashqueuelab.lab import showcase
    from crashqueuelab.lab.bench import runner as bench_runner
    from crashqueuelab.lab.campaign import diskfaults
    from crashqueuelab.lab.mutants import runner as mutants_runner

    if command == "disk-faults" and unavailable_reason() is not None:
        pytest.skip(str(unavailable_reason()))
    # The bench measures five lanes for each (work, workers) pair: its sixth run is the
    # second pair's first.
    step = _interrupting(after=6 if command == "bench" else 2)
    directory = tmp_path / command
    if command == "disk-faults":
        real_case = diskfaults.run_case
        monkeypatch.setattr(diskfaults, "run_case", lambda *a, **k: step(real_case, *a, **k))
        argv = ["disk-faults", "--system", "walqueue", "--disk-fault", "eio-fsync", "--count",
                "1", "--quiet"]  # fmt: skip
        run_file, done_key = "disk-faults.json", "disk_fault_cases"
        done: object = [{"disk_fault": "eio-fsync", "step": "submit-a", "verdict": "passed",
                 "directory": "eio-fsync/01-submit-a"}]  # fmt: skip
    elif command == "showcase":
        real_campaign = getattr(showcase, "run_campaign")  # noqa: B009 (not re-exported)
        monkeypatch.setattr(showcase, "run_campaign", lambda *a, **k: step(real_campaign, *a, **k))
        argv = ["showcase", "--system", "sqlite", "--quiet"]
        run_file, done_key = "showcase.json", "parts_done"
        done = ["sqlite: effect experiment", "sqlite: crash campaign"]
    elif command == "mutants":
        real_mutant = mutants_runner.run_mutant
        monkeypatch.setattr(
            mutants_runner, "run_mutant", lambda *a, **k: step(real_mutant, *a, **k)
        )
        argv = ["mutants", "--named-evidence", "--mutant", "no_fencing", "--mutant",
                "fence_off_by_one", "--quiet"]  # fmt: skip
        run_file, done_key, done = "mutants.json", "mutants_done", 1
    else:
        real_config = bench_runner.run_config
        monkeypatch.setattr(bench_runner, "run_config", lambda *a, **k: step(real_config, *a, **k))
        argv = ["bench", "--jobs", "20", "--workers", "1", "--work-ms", "0,1", "--quiet"]
        run_file, done_key, done = "bench.json", "cells_done", 5
    outcome = run_cli(*argv, "--output-directory", str(directory))
    assert outcome.code == EXIT_INTERRUPTED
    assert (outcome.result["ok"], outcome.result["interrupted"], outcome.result["signal"]) == (
        False,
        True,
        "SIGINT",
    )
    assert outcome.stderr.rstrip().splitlines()[-1].startswith("crashqueuelab: interrupted: ")
    kept = json.loads((directory / run_file).read_text())
    assert kept[done_key] == done
    assert kept["arguments"][0] == command
    page = (directory / "report.html").read_text()
    assert "INTERRUPTED" in page
    assert "Run it again:" in page
    if command == "disk-faults":  # the cases it ran, of those it planned
        planned = len(STEPS)  # walqueue's checkpoint does durable work: every step is a case
        assert f'disk-fault cases run</th><td class="num">1 of {planned}</td>' in page


def test_a_showcase_stopped_while_it_writes_a_parts_page_links_that_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_cli: RunCli
) -> None:
    """A part is finished once its record is kept; the signal may land while its page is
    written. The stopped run's page builds it and links it, and the command it names for a
    page it cannot build is one that runs from where the run was started."""
    from crashqueuelab.cli import experiments
    from crashqueuelab.cli.pages import html_report as real
    from crashqueuelab.lab.pages import stopped

    def page(directory: Path, *args: Any) -> str | None:
        if directory.name == "process-fault-campaign":
            raise Interrupted("SIGINT")
        return real(directory, *args)

    monkeypatch.setattr(experiments, "html_report", page)
    monkeypatch.chdir(tmp_path)
    outcome = run_cli(
        "showcase", "--system", "sqlite", "--quiet", "--output-directory", "runs/stopped"
    )
    assert outcome.code == EXIT_INTERRUPTED
    directory = tmp_path / "runs/stopped"
    kept = json.loads((directory / "showcase.json").read_text())
    assert kept["parts_done"] == ["sqlite: effect experiment", "sqlite: crash campaign"]
    assert (directory / "sqlite/process-fault-campaign/report.html").is_file()
    page_text = (directory / "report.html").read_text()
    assert '<a href="sqlite/process-fault-campaign/report.html">' in page_text
    assert "none yet" not in page_text
    # A part whose page is still missing is named with the path a user types.
    (directory / "sqlite/process-fault-campaign/report.html").unlink()
    view = stopped.stopped_view(directory, kept)
    [_, campaign] = view.data["parts"]
    assert (campaign["page"], campaign["build"]) == (
        None,
        "runs/stopped/sqlite/process-fault-campaign",
    )


def test_a_campaign_stopped_while_it_prints_a_case_starts_no_more_cases() -> None:
    """The signal may land in a progress line rather than while a case is awaited: the
    cases still queued must not start all the same (they once did, one after another,
    until the run overran every limit)."""
    import threading
    from types import SimpleNamespace

    from crashqueuelab.lab.campaign.run import _run_cases

    started: list[int] = []
    stops: list[threading.Event | None] = []

    def runner(*args: Any, stop: threading.Event | None = None, **kwargs: Any) -> dict[str, Any]:
        started.append(args[1])
        stops.append(stop)
        return {"passed": True, "exit_code": 0}

    def progress(line: str) -> None:
        raise Interrupted("SIGTERM")

    order = [SimpleNamespace(name=f"point-{index}") for index in range(20)]
    with pytest.raises(Interrupted) as caught:
        _run_cases(Path("unused"), order, 1, None, "x", runner, progress, 1)  # type: ignore[arg-type]
    assert caught.value.partial["cases_done"] == 1
    assert caught.value.partial["cases_planned"] == 20
    # The first case, and at most the one the pool had begun when it was told to stop.
    assert len(started) <= 2
    assert stops[0] is not None
    assert stops[0].is_set()


def test_an_interrupted_showcase_page_names_its_system_the_running_part_and_the_finished_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_cli: RunCli
) -> None:
    """Stopped in its crash campaign's second case: the page names the system and the part
    that was running (the crash points it counts are that part's), links the effect
    experiment it had finished (its page was written when it finished), and proposes a
    command that works: the same run into a new directory."""
    from crashqueuelab.lab import showcase

    real_campaign = getattr(showcase, "run_campaign")  # noqa: B009 (not re-exported)

    def progress(line: str) -> None:
        if "case 2/" in line:
            raise Interrupted("SIGINT")

    monkeypatch.setattr(
        showcase, "run_campaign", lambda *a, **k: real_campaign(*a, **(k | {"progress": progress}))
    )
    directory = tmp_path / "s"
    (tmp_path / "s-2").mkdir()  # taken: the page proposes the next free name
    outcome = run_cli("showcase", "--system", "sqlite", "--quiet", "--output-directory", directory)
    assert outcome.code == EXIT_INTERRUPTED
    kept = json.loads((directory / "showcase.json").read_text())
    effect = "sqlite/effect-commit-before-acknowledgement"
    assert kept["systems"] == ["sqlite"]
    assert kept["running"] == "sqlite: crash campaign"
    assert kept["parts"] == [{"part": "sqlite: effect experiment", "directory": effect}]
    assert (kept["cases_done"], kept["cases_planned"]) == (2, 13)
    assert (directory / effect / "report.html").is_file()  # without `report DIR`
    page = (directory / "report.html").read_text()
    assert "system <b>sqlite</b>" in page
    assert "crash points run (sqlite: crash campaign)" in page
    assert f'<a href="{effect}/report.html">' in page
    assert "Below is what it had finished" in page
    again = f"--output-directory {tmp_path / 's-3'}"
    assert f"crashqueuelab showcase --system sqlite --quiet {again}</pre>" in page


def test_a_stopped_run_that_finished_nothing_promises_nothing_below(tmp_path: Path) -> None:
    from crashqueuelab.lab.pages.render import write_report

    directory = tmp_path / "c"
    directory.mkdir()
    record = {
        "ok": False, "interrupted": True, "signal": "SIGTERM", "command": "chaos",
        "arguments": ["chaos", "--output-directory=c"], "seed": 1, "stopped_after_s": 0.2,
        "reasons": ["interrupted by SIGTERM after 0.2 s"],
    }  # fmt: skip
    (directory / "chaos.json").write_text(json.dumps(record))
    page = write_report(directory).read_text()
    assert "It had finished nothing it could show." in page
    assert "below" not in page.lower()
    assert "crashqueuelab chaos --output-directory=c-2</pre>" in page


def test_a_stopped_run_kept_without_its_arguments_is_proposed_into_a_new_directory(
    tmp_path: Path,
) -> None:
    from crashqueuelab.lab.pages.stopped import again

    (tmp_path / "run-2").mkdir()
    assert again(["bench"], tmp_path / "run") == [
        "bench",
        "--output-directory",
        f"{tmp_path / 'run'}-3",
    ]
