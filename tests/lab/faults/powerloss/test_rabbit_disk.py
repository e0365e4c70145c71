"""RabbitMQ on the power-loss disk: what a single node keeps of the messages it confirmed
(evidence for ``docs/real-queues.md`` and ``docs/power-loss.md``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from crashqueuelab.lab.faults.powerloss.crashstate import LOSE_ALL, Choice
from crashqueuelab.lab.faults.powerloss.journal import JOURNAL_FILE, Journal, load_journal
from crashqueuelab.servers.rabbitmq import find_binaries
from tests.conftest import RunCli

needs_the_disk = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not Path("/dev/fuse").exists(),
    reason="power loss needs Linux with /dev/fuse",
)
needs_a_node = pytest.mark.skipif(
    find_binaries() is None, reason="no rabbitmq-server here: install Debian's rabbitmq-server"
)


def test_a_queue_short_of_its_confirmed_messages_fails_and_one_over_what_was_sent_too() -> None:
    from crashqueuelab.lab.failover.rabbitpower import judge_queue

    sent = {"confirmed": 3, "unconfirmed": 2}
    assert judge_queue(3, sent)["passed"]
    assert judge_queue(5, sent)["passed"]
    assert judge_queue(4, sent)["unconfirmed_kept"] == 1
    short = judge_queue(1, sent)
    assert (short["passed"], short["lost_confirmed"]) == (False, 2)
    assert short["why"] == "2 of 3 confirmed messages lost"
    assert judge_queue(6, sent)["why"] == "6 messages, 5 published"
    gone = judge_queue(None, sent)
    assert (gone["passed"], gone["lost_confirmed"], gone["why"]) == (False, 3, "the queue is gone")


def test_a_bounded_run_starts_lose_all_first_then_every_name_kept_then_the_others() -> None:
    from crashqueuelab.lab.faults.powerloss.crashstate import bounded_order

    journal = Journal()
    for index in range(3):
        journal.name_op("create", f"/f{index}", index + 10)
    everything = Choice(frozenset(range(3)), None)
    some = Choice(frozenset({1}), None)
    seeded = Choice(None, 7)
    zeroed = Choice(frozenset(), None, zeroed_tails=True)
    assert bounded_order([some, seeded, zeroed, everything, LOSE_ALL], journal) == [
        LOSE_ALL, everything, zeroed, seeded, some,
    ]  # fmt: skip


def test_a_node_that_refuses_a_crash_state_is_reported_with_its_words_and_never_passes(
    tmp_path: Path,
) -> None:
    from crashqueuelab.lab.failover.rabbitpower import judge_placed
    from crashqueuelab.lab.faults.powerloss.crashstate import CrashState
    from crashqueuelab.lab.faults.powerloss.targets import Placed

    said = "the server did not start on the crash state: rabbitmq-server did not start: ..."
    placed = Placed(CrashState(LOSE_ALL, tmp_path), said)
    sent = {"classic": {"confirmed": 1, "unconfirmed": 0}}
    judged = judge_placed(placed, sent, tmp_path)
    assert judged == {"choice": "lose-all", "pending": 0, "passed": False, "refused": said}


def test_power_cut_refuses_a_machine_without_the_disk_or_the_server_before_making_anything(
    tmp_path: Path, run_cli: RunCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crashqueuelab.cli import powercut

    run = tmp_path / "run"
    monkeypatch.setattr(powercut, "find_binaries", lambda: None)
    monkeypatch.setattr(powercut, "require_power_loss", lambda: None)
    refused = run_cli("power-cut", "--output-directory", run)
    assert refused.code == 4
    assert refused.result["error"]["type"] == "ServerUnavailable"
    assert "rabbitmq-server is not installed here" in refused.result["error"]["message"]
    assert not run.exists()
    bad = run_cli("power-cut", "--output-directory", run, "--states", "0")
    assert bad.code == 2
    assert not run.exists()
    # A publisher whose library is not installed: said on one line, nothing made.
    monkeypatch.setattr(powercut, "find_binaries", lambda: Path("/usr/lib/rabbitmq/bin"))
    monkeypatch.setattr(powercut, "find_spec", lambda name: None)
    for publisher, extra in (("celery", "celery"), ("pika", "dramatiq"), ("dramatiq", "dramatiq")):
        missing = run_cli("power-cut", "--output-directory", run, "--publisher", publisher)
        assert missing.code == 2, publisher
        error = missing.result["error"]
        assert error["type"] == "SystemUnavailable"
        assert f"{publisher} is not installed" in error["message"]
        assert f"[{extra}]" in error["message"]
        assert "\n" not in error["message"]
        assert not run.exists()


@pytest.mark.server_fault
@needs_the_disk
@needs_a_node
def test_a_node_keeps_what_it_confirmed_only_where_its_new_files_names_reached_the_disk(
    tmp_path: Path, run_cli: RunCli
) -> None:
    # RabbitMQ 3.10 syncs the files that hold a confirmed message before it confirms (the
    # classic queue's message store and index journal, the quorum queue's Ra WAL), and never
    # a directory: the index journal (and its queue's directory) and the WAL file a node
    # makes at its boot are new names that no fsync covers. With them lost (lose-all), every
    # confirmed message is gone from both queues; with every pending name kept, all are there.
    from crashqueuelab.lab.failover.rabbitpower import QUEUES

    run = tmp_path / "run"
    outcome = run_cli(
        "power-cut", "--output-directory", run, "--confirmed", "10", "--unconfirmed", "3",
        "--states", "2", "--quiet",
    )  # fmt: skip
    assert outcome.code == 1, outcome.stderr
    assert outcome.result["reasons"][0] == (
        "crash state lose-all: classic queue: 10 of 10 confirmed messages lost"
    )
    report = json.loads((run / "power-cut.json").read_text())
    assert outcome.result["verdict"] == report["verdict"]
    cut = report["power_cut"]
    assert (cut["directory_syncs"], cut["crash_states"], report["refused"]) == (0, 2, 0)
    lose_all, every_name = report["crash_states"]
    assert lose_all["choice"] == "lose-all"
    assert every_name["choice"].startswith("keep-names-1-2-3-")
    for name in QUEUES:
        assert report["sent"][name] == {"confirmed": 10, "unconfirmed": 3}
        assert lose_all["queues"][name]["lost_confirmed"] == 10, (name, lose_all)
        assert every_name["queues"][name]["passed"], (name, every_name)
    assert not report["passed"]
    pending = [op.target or op.path for op in load_journal(run / "disk" / JOURNAL_FILE).names]
    assert any("/quorum/" in path and path.endswith(".wal") for path in pending)
    assert any(path.endswith("/journal.jif") for path in pending)
    # The evidence: each state's fates and what its node said of its recovery.
    assert (run / "crash-states" / "lose-all" / "state.json").is_file()
    assert (run / "crash-states" / "lose-all" / "recovery-server.node.log").is_file()
    # The page says it per state and per queue, from the record.
    page = (run / "report.html").read_text()
    assert "FAILED" in page
    assert "0 listed, 10 confirmed" in page
    assert "kept every confirmed message" in page
    # Every node of the run is gone (the settling one, the case's, one per crash state).
    node = str(report["node"]["node"])
    assert not [pid for pid, line in _command_lines().items() if node in line]


def _command_lines() -> dict[str, str]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[entry.name] = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
    return found
