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
from pathlib import Path

import pytest

from crashqueuelab.lab.interrupts import EXIT_INTERRUPTED, Interrupted, interruptible
from crashqueuelab.lab.powerloss.disk import unavailable_reason

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
    # Workers, crash children and disks were stopped by the run itself.
    deadline = time.monotonic() + 10
    while _group_members(process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _group_members(process.pid) == []
    return process.returncode, out.decode(), first + err.decode()


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


@pytest.mark.slow
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
