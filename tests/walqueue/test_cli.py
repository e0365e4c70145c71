"""The JSON-lines CLI, in process and as ``python -m walqueue.cli``."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from walqueue import Queue
from walqueue.cli import EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE, main


def session(directory: Path, lines: list[str]) -> tuple[int, list[dict[str, Any]]]:
    out = io.StringIO()
    code = main([str(directory)], stdin=io.StringIO("\n".join(lines) + "\n"), stdout=out)
    return code, [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_session_runs_every_operation_and_survives_bad_lines(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    code, replies = session(directory, [
        '{"op": "put", "task_id": "a", "payload": {"n": 1}}',
        '{"op": "put_many", "items": [{"task_id": "b", "payload": {}}]}',
        "not json",
        "[1]",
        '{"op": "launch"}',
        '{"op": "get", "task_id": "zz"}',
        '{"op": "reserve", "worker": "w", "now": 0, "lease_seconds": 10, "limit": 2}',
        '{"op": "stats"}',
        '{"op": "compact"}',
        '{"op": "ack", "lease": {"task_id": "a"}, "now": 1}',
        "",
    ])  # fmt: skip
    assert code == EXIT_OK
    assert replies[0] == {"ok": True, "task_id": "a"}
    assert replies[1] == {"ok": True, "task_ids": ["b"]}
    assert [r["ok"] for r in replies[2:6]] == [False] * 4
    assert replies[3]["error"]["type"] == "TypeError"
    leases = replies[6]["leases"]
    assert [lease["task_id"] for lease in leases] == ["a", "b"]
    assert replies[7]["stats"]["last_seq"] == 3
    assert replies[8] == {"ok": True, "snapshot_seq": 3}
    assert replies[9]["ok"] is False
    lease_a, lease_b = leases
    code, replies = session(directory, [
        json.dumps({"op": "ack", "lease": lease_a, "now": 1}),
        json.dumps({"op": "ack", "lease": lease_a, "now": 1}),
        json.dumps({"op": "release", "lease": lease_b, "now": 2, "delay": 3}),
        '{"op": "get", "task_id": "b"}',
    ])  # fmt: skip
    assert [r["ok"] for r in replies] == [True, False, True, True]
    assert replies[1]["error"]["type"] == "StaleLease"
    assert replies[3]["task"]["available_at"] == 5


def test_a_store_that_cannot_be_opened_ends_the_session(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    with Queue(directory):
        code, replies = session(directory, ['{"op": "stats"}'])
    assert code == EXIT_UNAVAILABLE
    assert replies == [
        {"ok": False, "error": {"type": "QueueLocked", "message": replies[0]["error"]["message"]}}
    ]
    out = io.StringIO()
    assert main([], stdin=io.StringIO(""), stdout=out) == EXIT_USAGE


def test_python_dash_m_walqueue_cli(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "walqueue.cli", str(tmp_path / "q")],
        input='{"op": "put", "task_id": "x", "payload": {}}\n{"op": "stats"}\n',
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    replies = [json.loads(line) for line in run.stdout.splitlines()]
    assert replies[0] == {"ok": True, "task_id": "x"}
    assert replies[1]["stats"]["counts"]["ready"] == 1


def test_text_utf8_cannot_carry_and_deep_nesting_are_refused_and_the_session_goes_on(
    tmp_path: Path,
) -> None:
    code, replies = session(tmp_path / "q", [
        '{"op": "put", "task_id": "a", "payload": {"x": "\\ud800"}}',
        '{"op": "put", "task_id": "\\udcff", "payload": {}}',
        # Deep enough for every supported Python's parser to give up (3.13 takes 3,000).
        "[" * 100_000 + "]" * 100_000,
        '{"op": "put", "task_id": "b", "payload": {}}',
        '{"op": "stats"}',
    ])  # fmt: skip
    assert code == EXIT_OK
    assert [reply["ok"] for reply in replies] == [False, False, False, True, True]
    assert "cannot be stored" in replies[0]["error"]["message"]
    assert replies[2]["error"]["message"] == "the line is nested too deeply"
    assert replies[4]["stats"]["counts"]["ready"] == 1
    with Queue(tmp_path / "q") as queue:
        assert queue.task_ids() == ["b"]


def test_an_option_is_never_taken_for_a_directory(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    assert main(["--help"], stdin=io.StringIO(""), stdout=out) == EXIT_OK
    assert json.loads(out.getvalue())["usage"].startswith("usage: python -m walqueue.cli")
    out = io.StringIO()
    assert main(["--verbose"], stdin=io.StringIO(""), stdout=out) == EXIT_USAGE
    assert json.loads(out.getvalue())["ok"] is False
    assert list(tmp_path.iterdir()) == []


def test_a_queue_closed_by_a_failed_write_ends_the_session(
    tmp_path: Path, monkeypatch: Any
) -> None:
    from walqueue.store import Store

    def broken_disk(self: Store, txn: dict[str, Any], frame: bytes | None = None) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(Store, "append", broken_disk)
    out = io.StringIO()
    lines = '{"op": "put", "task_id": "a", "payload": {}}\n{"op": "stats"}\n'
    code = main([str(tmp_path / "q")], stdin=io.StringIO(lines), stdout=out)
    replies = [json.loads(line) for line in out.getvalue().splitlines()]
    assert code == EXIT_UNAVAILABLE
    assert "reopen it" in replies[-1]["error"]["message"]
    # A failed write on the last line still ends with the failure status.
    out = io.StringIO()
    code = main([str(tmp_path / "r")], stdin=io.StringIO(lines.splitlines()[0]), stdout=out)
    assert code == EXIT_UNAVAILABLE


def test_a_flipped_byte_in_the_last_acknowledged_put_ends_the_session_unchanged(
    tmp_path: Path,
) -> None:
    """As a user meets it: two puts acknowledged, one byte of the last one's digest damaged
    with an editor, then the command line on the directory: one CorruptStore line, exit 1,
    and the segment left as it was (nothing dropped as a torn tail)."""
    directory = tmp_path / "q"
    code, _ = session(directory, [
        '{"op": "put", "task_id": "a", "payload": {}}',
        '{"op": "put", "task_id": "b", "payload": {}}',
    ])  # fmt: skip
    assert code == EXIT_OK
    [segment] = directory.glob("wal-*.log")
    data = bytearray(segment.read_bytes())
    data[-1] ^= 0x20
    segment.write_bytes(bytes(data))
    code, replies = session(directory, ['{"op": "get", "task_id": "b"}'])
    assert code == EXIT_UNAVAILABLE
    assert [reply["error"]["type"] for reply in replies] == ["CorruptStore"]
    assert segment.read_bytes() == bytes(data)
