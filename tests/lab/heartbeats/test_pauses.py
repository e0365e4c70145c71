"""A pause, then a stop, in the heartbeat experiment: the fault alone (its clock and its
signals given to it), the judge's words for a job taken from a paused holder, and dramatiq
#266 reproduced on its releases: 1.10.0 runs a paused worker's prefetched message twice
once the worker is stopped, 1.11.0 does not."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab.judges.findings import Anomaly, Kind
from crashqueuelab.lab.heartbeats.faults import Held, Running
from crashqueuelab.lab.heartbeats.judge import Execution, judge
from crashqueuelab.lab.heartbeats.pauses import PAUSE, PausesThenStops
from crashqueuelab.systems.contract import JobStatus
from tests.conftest import RunCli

#: Worker w0 paused from 0.4 s to 1.4 s, in the judge's tests of a job taken from it.
W0_PAUSED = Held(PAUSE, 0.4, 1.4)


def _judged(runs: list[Execution], window: Held = W0_PAUSED) -> list[Anomaly]:
    """The judge's findings on jobs a and b, both done, with w0 held in ``window``."""
    done = {"a": JobStatus.SUCCEEDED, "b": JobStatus.SUCCEEDED}
    return judge(["a", "b"], runs, done, origin=0.0, held={"w0": [window]})


def test_a_pause_freezes_the_oldest_jobs_worker_then_thaws_and_stops_it_after_its_window() -> None:
    moment = [100.0]
    sent: list[tuple[int, signal.Signals]] = []
    pauses = PausesThenStops(
        1, retry_after_s=1.0, clock=lambda: moment[0], send=lambda pid, how: sent.append((pid, how))
    )
    pids: dict[str, int | None] = {"w0": 10, "w1": 11, "w2": None}
    pauses.strike_due([Running("w1", 99.8)], pids)  # not yet half a timer
    assert sent == []
    moment[0] = 100.6
    pauses.strike_due([Running("w1", 99.8), Running("w0", 99.5), Running("w2", 99.0)], pids)
    # w2 has no process to freeze; w0's job is the oldest of the others.
    assert sent == [(10, signal.SIGSTOP)]
    moment[0] = 102.0
    pauses.strike_due([Running("w1", 99.8)], pids)  # the window (2 timers) still runs
    assert len(sent) == 1
    moment[0] = 102.6
    pauses.strike_due([Running("w1", 99.8)], pids)
    assert sent[1:] == [(10, signal.SIGCONT), (10, signal.SIGTERM)]
    assert pauses.windows == {"w0": [Held(PAUSE, 100.6, 102.6)]}
    assert pauses.stopped == {"w0"}
    # One pause asked for, one delivered: nothing more strikes.
    moment[0] = 110.0
    pauses.strike_due([Running("w1", 99.8)], pids)
    assert len(sent) == 3
    report = pauses.report(origin=100.0)
    assert report["not_delivered"] == 0
    (delivered,) = report["delivered"]
    assert (delivered["target"], delivered["then"]) == ("w0", "SIGTERM")
    assert delivered["start"] == pytest.approx(0.6)


def test_a_worker_still_frozen_when_the_run_ends_is_thawed() -> None:
    sent: list[tuple[int, signal.Signals]] = []
    pauses = PausesThenStops(
        2, retry_after_s=1.0, clock=lambda: 50.0, send=lambda pid, how: sent.append((pid, how))
    )
    pauses.strike_due([Running("w0", 40.0)], {"w0": 7})
    pauses.thaw()
    assert sent == [(7, signal.SIGSTOP), (7, signal.SIGCONT)]
    assert pauses.report(origin=0.0)["not_delivered"] == 1


def test_a_job_taken_from_a_paused_holder_says_so_and_names_the_pause() -> None:
    runs = [Execution("a", "w0", 1.0, 5.0), Execution("a", "w1", 3.0, 7.0)]
    (found,) = judge(
        ["a"], runs, {"a": JobStatus.SUCCEEDED}, origin=0.0, held={"w0": [Held(PAUSE, 1.5, 3.5)]}
    )
    assert found.kind is Kind.RUN_AGAIN
    assert found.text == (
        "job a: run again beside w0's execution while w0 was paused (1.50 s to 3.50 s):"
        " by w0 from 1.00 s to 5.00 s, then by w1 from 3.00 s to 7.00 s"
    )
    assert dict(found.facts) == {"how": "beside", "connection_held": True, "fault": "pause"}


def test_a_job_handed_out_while_the_worker_that_ran_it_again_was_paused_names_the_pause() -> None:
    """dramatiq's worker prefetches: a paused worker's message not yet started is handed to
    another, and the paused worker runs its own copy once it is let go. Seen in CI: the
    pause ended with SIGTERM, and the paused worker's thread took its prefetched message
    before it stopped."""
    runs = [
        Execution("a", "w0", 0.1, 1.4),
        Execution("b", "w1", 0.95, 2.95),  # handed out while w0 was paused
        Execution("b", "w0", 1.42, 1.42),  # w0's own copy, after it was let go
    ]
    (found,) = _judged(runs)
    assert found.text == (
        "job b: run again beside w1's execution by w0, handed to w1 while w0 was paused"
        " (0.40 s to 1.40 s) and run by w0 after: by w1 from 0.95 s to 2.95 s, then by w0"
        " from 1.42 s to 1.42 s"
    )
    assert dict(found.facts) == {
        "how": "beside",
        "connection_held": True,
        "fault": "pause",
        "held_runner": "later",
    }
    # Handed out before the pause, started by the paused worker before it ended, a network
    # fault's window (the worker goes on taking jobs after it), or not the paused worker's
    # first run once thawed: a live worker's.
    for window, extra in (
        (Held(PAUSE, 1.0, 1.4), []),
        (Held(PAUSE, 0.4, 1.5), []),
        (Held("stall", 0.4, 1.4), []),
        (W0_PAUSED, [Execution("c", "w0", 1.41, 1.41)]),
    ):
        anomalies = _judged([*runs, *extra], window)
        (live,) = [each for each in anomalies if each.job == "b"]
        assert live.text.startswith("job b: run again beside a live worker's execution")
        assert dict(live.facts) == {"how": "beside", "connection_held": False}


def test_a_paused_workers_first_run_once_thawed_then_the_copy_handed_out_meanwhile_names_it() -> (
    None
):
    """The other order: the paused worker, thawed, runs its prefetched copy at once, and the
    copy the others' maintenance handed out during the pause, queued behind other jobs,
    runs later (met in dramatiq #442's pair, whose jobs end within the pause)."""
    runs = [
        Execution("a", "w0", 0.1, 1.4),
        Execution("b", "w0", 1.41, 3.41),  # w0's first run once thawed: its own copy
        Execution("b", "w1", 5.0, 7.0),  # the copy handed out during the pause
    ]
    (found,) = _judged(runs)
    assert found.text == (
        "job b: run again after w0's execution, its first since w0 was paused (0.40 s to"
        " 1.40 s), the job handed out again meanwhile: by w0 from 1.41 s to 3.41 s, then by"
        " w1 from 5.00 s to 7.00 s"
    )
    assert dict(found.facts) == {
        "how": "after",
        "connection_held": True,
        "fault": "pause",
        "held_runner": "first",
    }
    # The other run began before the pause, or the paused worker's run is not its first
    # once thawed, or the window is a network fault's: a live worker's.
    for other, extra, kind in (
        (Execution("b", "w1", 0.3, 0.35), [], PAUSE),
        (runs[2], [Execution("c", "w0", 1.405, 1.406)], PAUSE),
        (runs[2], [], "stall"),
    ):
        anomalies = _judged([*runs[:2], other, *extra], Held(kind, 0.4, 1.4))
        (live,) = [each for each in anomalies if each.job == "b"]
        assert "a live worker's execution" in live.text
        assert dict(live.facts)["connection_held"] is False


@pytest.mark.releases
@pytest.mark.quiet
@pytest.mark.early
def test_dramatiq_1_10_0_runs_a_stopped_workers_prefetched_message_twice_and_1_11_0_does_not(
    tmp_path: Path, redis_socket: str, release_cache: Path, run_cli: RunCli
) -> None:
    """dramatiq #266: the maintenance of the live workers puts back the messages of a worker
    frozen past its heartbeat timeout; stopped once it thaws, the worker puts back the one
    it had prefetched and never started. 1.10.0 pushes it onto the queue a second time, and
    it runs twice; 1.11.0 pushes only what is still in the worker's acks set.

    The retry timer (the brokers' heartbeat timeout) is dramatiq's adapter's default, 2 s: a
    live worker's heartbeats come from its consumers' fetches, and at 1 s the test failed in
    two whole test-command runs of two (1.11.0 judged broken), and in none of about twenty
    runs of it alone or of the quiet tests alone."""
    directory = tmp_path / "m"
    outcome = run_cli(
        "versions", "--system", "dramatiq", "--releases", "1.10.0,1.11.0", "--bisect",
        "--bisect-on", "promises", "--output-directory", str(directory),
        "heartbeats", "--workers", "3", "--pauses-then-stops", "1", "--retry-timer-s", "2",
    )  # fmt: skip

    def record(release: str) -> dict[str, Any]:
        kept: dict[str, Any] = json.loads((directory / release / "heartbeats.json").read_text())
        return kept

    old, fixed = record("1.10.0"), record("1.11.0")
    assert outcome.code == 1, outcome.stderr
    assert outcome.result["bisection"]["found"] == "1.11.0", outcome.stderr
    paused = {}
    for release, each in (("1.10.0", old), ("1.11.0", fixed)):
        (pause,) = each["pauses"]["delivered"]
        assert pause["then"] == "SIGTERM"
        paused[release] = pause["target"]
    # What the pause causes is dramatiq's promise for a failed worker, on both releases.
    assert fixed["promises"]["keeps_its_promises"] is True
    assert all("was paused" in line for line in fixed["anomalies"])
    # 1.10.0: a job the paused worker never started runs twice, beside a live worker.
    assert old["promises"]["keeps_its_promises"] is False
    (broken,) = old["promises"]["broken_promises"]
    assert "run again beside a live worker's execution" in broken or "run again after" in broken
    twice = [key for key, job in old["jobs"].items() if job["runs"] > 1]
    started_by_paused = {
        run["key"] for run in old["executions"] if run["worker"] == paused["1.10.0"]
    }
    assert set(twice) - started_by_paused


def test_dramatiqs_installed_release_hands_a_paused_workers_messages_out_as_it_promises(
    tmp_path: Path, redis_socket: str, run_cli: RunCli
) -> None:
    """On the installed release, the pause's hand-outs are dramatiq's promise for a failed
    worker, and nothing else runs twice: the stopped worker puts back nothing the others'
    maintenance had put back already. The page draws the pause beside the executions."""
    pytest.importorskip("dramatiq")
    directory = tmp_path / "h"
    outcome = run_cli(
        "heartbeats", "--system", "dramatiq", "--jobs", "2", "--workers", "2",
        "--retry-timer-s", "0.5", "--pauses-then-stops", "1",
        "--output-directory", str(directory),
    )  # fmt: skip
    record = json.loads((directory / "heartbeats.json").read_text())
    assert record["error"] is None
    (pause,) = record["pauses"]["delivered"]
    assert pause["then"] == "SIGTERM"
    assert outcome.result["pauses_delivered"] == 1
    assert record["promises"]["keeps_its_promises"] is True, record["anomalies"]
    assert all("was paused" in line for line in record["anomalies"])
    assert {job["stored"] for job in record["jobs"].values()} == {"succeeded"}
    assert record["workers"][pause["target"]]["exit"] == 0
    page = (directory / "report.html").read_text()
    assert f"{pause['target']} paused" in page
    assert "--pauses-then-stops 1" in page
