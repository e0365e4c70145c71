"""The JSON CLI: one JSON object on stdout, named exit codes, bad input changes nothing."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab.cli import EXIT_OK, EXIT_REJECTED, EXIT_STORE, EXIT_USAGE, build_parser, main
from tests.conftest import RunCli, fingerprint, invoke_cli, raw

NOW = 5_000_000


def submit(
    db: Path, key: str = "request-1", payload: str = '{"effect_key":"e1","value":7}'
) -> dict[str, Any]:
    outcome = invoke_cli(
        "submit",
        "--database",
        str(db),
        "--idempotency-key",
        key,
        "--job-type",
        "synthetic.effect",
        "--payload",
        payload,
        "--now-us",
        str(NOW),
    )
    assert outcome.code == EXIT_OK, outcome.result
    return outcome.result


def claim(db: Path, worker: str = "worker-a", now: int = NOW + 1) -> dict[str, Any]:
    outcome = invoke_cli(
        "claim",
        "--database",
        str(db),
        "--worker-id",
        worker,
        "--lease-duration-us",
        "1000",
        "--now-us",
        str(now),
    )
    assert outcome.code == EXIT_OK, outcome.result
    claimed: dict[str, Any] = outcome.result["claimed"]
    return claimed


def test_a_full_round_trip_ends_in_a_passing_check(db_path: Path, run_cli: RunCli) -> None:
    created = submit(db_path)
    assert created["created"] is True
    job_id = created["job"]["job_id"]
    assert created["job"]["payload"] == {"effect_key": "e1", "value": 7}
    claimed = claim(db_path)
    token = claimed["lease_token"]
    beat = run_cli(
        "heartbeat",
        "--database",
        str(db_path),
        "--job-id",
        job_id,
        "--worker-id",
        "worker-a",
        "--lease-token",
        token,
        "--lease-duration-us",
        "5000",
        "--now-us",
        str(NOW + 2),
    )
    assert beat.code == EXIT_OK
    assert beat.result["claimed"]["lease_deadline_us"] == NOW + 5002
    done = run_cli(
        "succeed",
        "--database",
        str(db_path),
        "--job-id",
        job_id,
        "--worker-id",
        "worker-a",
        "--lease-token",
        token,
        "--now-us",
        str(NOW + 3),
    )
    assert (done.code, done.result["job"]["state"]) == (EXIT_OK, "SUCCEEDED")
    history = run_cli("history", "--database", str(db_path), "--job-id", job_id)
    assert [e["event_type"] for e in history.result["events"]] == [
        "SUBMITTED",
        "CLAIMED",
        "HEARTBEAT",
        "SUCCEEDED",
    ]
    replay = run_cli("replay", "--database", str(db_path), "--job-id", job_id)
    assert (replay.code, replay.result["ok"], replay.result["replay"]["events_replayed"]) == (
        EXIT_OK,
        True,
        4,
    )
    check = run_cli("check", "--database", str(db_path))
    assert (check.code, check.result["ok"], check.result["check"]["failed"]) == (EXIT_OK, True, [])


def test_fail_recover_and_promote_through_the_cli(db_path: Path, run_cli: RunCli) -> None:
    job_id = submit(db_path)["job"]["job_id"]
    token = claim(db_path)["lease_token"]
    failed = run_cli(
        "fail",
        "--database",
        str(db_path),
        "--job-id",
        job_id,
        "--worker-id",
        "worker-a",
        "--lease-token",
        token,
        "--error",
        "handler raised",
        "--now-us",
        str(NOW + 2),
        "--retry-base-us",
        "10",
    )
    assert (failed.code, failed.result["job"]["state"]) == (EXIT_OK, "RETRY_SCHEDULED")
    assert failed.result["job"]["available_at_us"] == NOW + 12
    promoted = run_cli("promote", "--database", str(db_path), "--now-us", str(NOW + 12))
    assert promoted.result["promoted"] == [job_id]
    claim(db_path, now=NOW + 20)
    recovered = run_cli("recover", "--database", str(db_path), "--now-us", str(NOW + 2000))
    assert recovered.result["recovered"] == [job_id]
    check = run_cli("check", "--database", str(db_path))
    assert check.result["ok"]


def test_stale_operations_exit_rejected_with_a_structured_error(
    db_path: Path, run_cli: RunCli
) -> None:
    job_id = submit(db_path)["job"]["job_id"]
    token = claim(db_path)["lease_token"]
    before = fingerprint(db_path)
    outcome = run_cli(
        "succeed",
        "--database",
        str(db_path),
        "--job-id",
        job_id,
        "--worker-id",
        "worker-b",
        "--lease-token",
        token,
        "--now-us",
        str(NOW + 2),
    )
    assert outcome.code == EXIT_REJECTED
    assert outcome.result["ok"] is False
    assert outcome.result["error"]["type"] == "StaleLease"
    assert outcome.result["error"]["reason"] == "wrong_worker"
    assert "wrong_worker" in outcome.stderr
    assert fingerprint(db_path) == before


def test_an_idempotency_conflict_is_rejected(db_path: Path, run_cli: RunCli) -> None:
    submit(db_path)
    before = fingerprint(db_path)
    outcome = run_cli(
        "submit",
        "--database",
        str(db_path),
        "--idempotency-key",
        "request-1",
        "--job-type",
        "synthetic.effect",
        "--payload",
        '{"value":8}',
    )
    assert outcome.code == EXIT_REJECTED
    assert outcome.result["error"]["type"] == "IdempotencyConflict"
    assert outcome.result["error"]["differing"] == ["payload"]
    assert fingerprint(db_path) == before


BAD_SUBMISSIONS = {
    "invalid JSON": ["--payload", "{not json"],
    "a non-object payload": ["--payload", "[1, 2]"],
    "NaN": ["--payload", '{"x": NaN}'],
    "Infinity": ["--payload", '{"x": -Infinity}'],
    "a duplicate key": ["--payload", '{"x": 1, "x": 2}'],
    "an oversized payload": ["--payload", json.dumps({"x": "y" * 70_000})],
    "a deeply nested payload": ["--payload", '{"a":' * 40 + "1" + "}" * 40],
    "a hopelessly long payload": ["--payload", "[" * 300_000],
    "an empty key": ["--idempotency-key", ""],
    "zero attempts": ["--max-attempts", "0"],
    "a word for attempts": ["--max-attempts", "three"],
    "a negative time": ["--now-us", "-5"],
    "a time beyond 64 bits": ["--now-us", "99999999999999999999999"],
    "a lone surrogate in the payload": ["--payload", '{"a": "\\ud800"}'],
    "a lone surrogate as a key": ["--payload", '{"\\udc00": 1}'],
    "a 5,000-digit integer": ["--payload", '{"a": ' + "9" * 5000 + "}"],
    "an integer beyond 64 bits": ["--payload", '{"a": ' + "9" * 30 + "}"],
    "an undecodable byte in the key": [
        "--idempotency-key",
        b"\xff".decode("utf-8", "surrogateescape"),
    ],
}


@pytest.mark.parametrize("case", list(BAD_SUBMISSIONS))
def test_bad_submissions_get_a_usage_error_and_change_nothing(
    db_path: Path, case: str, run_cli: RunCli
) -> None:
    submit(db_path, key="existing")
    before = fingerprint(db_path)
    argv = {
        "--database": str(db_path),
        "--idempotency-key": "new",
        "--job-type": "t",
        "--payload": "{}",
    }
    override = BAD_SUBMISSIONS[case]
    argv[override[0]] = override[1]
    flat = ["submit", *[part for pair in argv.items() for part in pair]]
    outcome = run_cli(*flat)
    assert outcome.code == EXIT_USAGE
    assert outcome.result["ok"] is False
    assert set(outcome.result["error"]) >= {"type", "message"}
    assert fingerprint(db_path) == before


@pytest.mark.parametrize(
    "argv",
    [
        ["claim", "--worker-id", "w", "--lease-duration-us", "0"],
        ["claim", "--worker-id", "w", "--lease-duration-us", "-3"],
        ["claim", "--worker-id", ""],
        [
            "heartbeat",
            "--job-id",
            "j",
            "--worker-id",
            "w",
            "--lease-token",
            "t",
            "--lease-duration-us",
            "0",
        ],
        ["succeed", "--job-id", "", "--worker-id", "w", "--lease-token", "t"],
        ["claim", "--worker-id", "w", "--now-us", "9223372036854775807"],
        ["claim", "--worker-id", "w\udcff"],
        ["fail", "--job-id", "j", "--worker-id", "w", "--lease-token", "t"],
        ["bogus"],
        [],
    ],
)
def test_bad_arguments_get_a_usage_error_and_change_nothing(
    db_path: Path, argv: list[str], run_cli: RunCli
) -> None:
    submit(db_path)
    claim(db_path)
    before = fingerprint(db_path)
    full = [*argv[:1], "--database", str(db_path), *argv[1:]] if argv[:1] != ["bogus"] else argv
    outcome = run_cli(*full)
    assert outcome.code == EXIT_USAGE
    assert outcome.result["ok"] is False
    assert fingerprint(db_path) == before


@pytest.mark.parametrize("command", ["claim", "promote", "recover", "check", "replay"])
def test_a_missing_database_is_not_created(tmp_path: Path, command: str, run_cli: RunCli) -> None:
    missing = tmp_path / "nothing.sqlite"
    argv = [command, "--database", str(missing)]
    if command == "claim":
        argv += ["--worker-id", "w"]
    outcome = run_cli(*argv)
    assert outcome.code == EXIT_STORE
    assert outcome.result["error"]["type"] == "StoreNotFound"
    assert not missing.exists()


def test_history_of_a_missing_database_or_job(
    tmp_path: Path, db_path: Path, run_cli: RunCli
) -> None:
    outcome = run_cli("history", "--database", str(tmp_path / "x.sqlite"), "--job-id", "j")
    assert (outcome.code, outcome.result["error"]["type"]) == (EXIT_STORE, "StoreNotFound")
    submit(db_path)
    outcome = run_cli("history", "--database", str(db_path), "--job-id", "job-none")
    assert (outcome.code, outcome.result["error"]["type"]) == (EXIT_REJECTED, "JobNotFound")


@pytest.mark.parametrize("command", ["submit", "check", "replay"])
def test_a_file_that_is_not_sqlite_is_refused_untouched(
    tmp_path: Path, command: str, run_cli: RunCli
) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("shopping list\n" * 100)
    before = path.read_bytes()
    argv = [command, "--database", str(path)]
    if command == "submit":
        argv += ["--idempotency-key", "k", "--job-type", "t", "--payload", "{}"]
    outcome = run_cli(*argv)
    assert (outcome.code, outcome.result["error"]["type"]) == (EXIT_STORE, "NotADatabase")
    assert path.read_bytes() == before


def test_another_schema_version_is_refused_untouched(db_path: Path, run_cli: RunCli) -> None:
    submit(db_path)
    conn = raw(db_path)
    conn.execute("PRAGMA user_version = 4")
    conn.close()
    before = fingerprint(db_path)
    for argv in (["claim", "--worker-id", "w"], ["check"], ["replay"]):
        outcome = run_cli(argv[0], "--database", str(db_path), *argv[1:])
        assert (outcome.code, outcome.result["error"]["type"]) == (EXIT_STORE, "SchemaMismatch")
    assert fingerprint(db_path) == before


def test_dropped_triggers_fail_the_check_and_refuse_writes(db_path: Path, run_cli: RunCli) -> None:
    submit(db_path)
    conn = raw(db_path)
    conn.execute("DROP TRIGGER events_no_update")
    conn.close()
    before = fingerprint(db_path)
    outcome = run_cli("check", "--database", str(db_path))
    assert (outcome.code, outcome.result["ok"]) == (EXIT_REJECTED, False)
    assert outcome.result["check"]["failed"] == ["append_only_triggers"]
    outcome = run_cli("claim", "--database", str(db_path), "--worker-id", "w")
    assert (outcome.code, outcome.result["error"]["type"]) == (EXIT_STORE, "HistoryUnprotected")
    assert outcome.result["error"]["missing"] == ["events_no_update"]
    assert fingerprint(db_path) == before


def test_a_failed_replay_exits_rejected(db_path: Path, run_cli: RunCli) -> None:
    submit(db_path)
    conn = raw(db_path)
    conn.execute("UPDATE jobs SET attempts = 1")
    conn.close()
    outcome = run_cli("replay", "--database", str(db_path))
    assert (outcome.code, outcome.result["ok"]) == (EXIT_REJECTED, False)
    assert outcome.result["replay"]["mismatches"][0]["field"] == "attempts"
    assert "not ok" in outcome.stderr


def test_python_dash_m_prints_one_json_object_and_exit_codes(db_path: Path) -> None:
    command = [sys.executable, "-m", "crashqueuelab"]
    ok = subprocess.run(
        [
            *command,
            "submit",
            "--database",
            str(db_path),
            "--idempotency-key",
            "k",
            "--job-type",
            "t",
            "--payload",
            "{}",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert ok.returncode == EXIT_OK
    assert json.loads(ok.stdout)["created"] is True
    bad = subprocess.run(
        [
            *command,
            "submit",
            "--database",
            str(db_path),
            "--idempotency-key",
            "k",
            "--job-type",
            "t",
            "--payload",
            "{oops",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert bad.returncode == EXIT_USAGE
    assert json.loads(bad.stdout)["error"]["type"] == "InvalidInput"
    assert "Traceback" not in bad.stderr
    helped = subprocess.run(
        [*command, "--help"], capture_output=True, text=True, check=False, timeout=60
    )
    assert helped.returncode == 0
    assert "Exit codes" in helped.stdout


def test_submit_creates_the_database_and_its_missing_directories(
    tmp_path: Path, run_cli: RunCli
) -> None:
    target = tmp_path / "new" / "nested" / "queue.sqlite"
    outcome = run_cli(
        "submit", "--database", str(target), "--idempotency-key", "k",
        "--job-type", "t", "--payload", "{}",
    )  # fmt: skip
    assert (outcome.code, outcome.result["created"]) == (EXIT_OK, True)
    assert target.is_file()


def test_a_database_that_cannot_be_opened_is_a_store_error(tmp_path: Path, run_cli: RunCli) -> None:
    directory = tmp_path / "a-directory.sqlite"
    directory.mkdir()
    outcome = run_cli(
        "submit", "--database", str(directory), "--idempotency-key", "k",
        "--job-type", "t", "--payload", "{}",
    )  # fmt: skip
    assert outcome.code == EXIT_STORE
    assert outcome.result["error"]["type"] in ("StoreError", "NotADatabase")


def test_sqlite_and_os_errors_become_structured_errors(
    db_path: Path, monkeypatch: pytest.MonkeyPatch, run_cli: RunCli
) -> None:
    submit(db_path)

    def locked(*args: object, **kwargs: object) -> None:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr("crashqueuelab.cli.database.check_database", locked)
    outcome = run_cli("check", "--database", str(db_path))
    assert (outcome.code, outcome.result["error"]["type"]) == (EXIT_STORE, "SQLiteError")

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError("permission denied")

    monkeypatch.setattr("crashqueuelab.cli.experiments.run_demo", denied)
    outcome = run_cli("demo", "--output-directory", str(db_path.parent / "d"))
    assert (outcome.code, outcome.result["error"]["type"]) == (EXIT_STORE, "OSError")


def test_claim_with_a_limit_leases_a_batch_in_one_transaction(
    db_path: Path, run_cli: RunCli
) -> None:
    for key in ("k1", "k2", "k3"):
        submit(db_path, key=key)
    outcome = run_cli(
        "claim", "--database", str(db_path), "--worker-id", "w", "--limit", "2",
        "--now-us", str(NOW + 1),
    )  # fmt: skip
    assert outcome.code == EXIT_OK
    claimed = outcome.result["claimed"]
    assert [c["attempt"] for c in claimed] == [1, 1]
    assert len({c["lease_token"] for c in claimed}) == 2
    outcome = run_cli(
        "claim", "--database", str(db_path), "--worker-id", "w", "--limit", "5",
        "--now-us", str(NOW + 2),
    )  # fmt: skip
    assert len(outcome.result["claimed"]) == 1
    outcome = run_cli("claim", "--database", str(db_path), "--worker-id", "w", "--limit", "0")
    assert outcome.code == EXIT_USAGE


def test_replaying_an_unknown_job_is_job_not_found(db_path: Path, run_cli: RunCli) -> None:
    submit(db_path)
    outcome = run_cli("replay", "--database", str(db_path), "--job-id", "job-none")
    assert (outcome.code, outcome.result["error"]["type"]) == (EXIT_REJECTED, "JobNotFound")


def test_the_verdict_comes_first_in_every_answer(db_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    main(["check", "--database", str(db_path)], stdout=out, stderr=err)
    assert out.getvalue().lstrip().startswith('{\n  "ok": false,\n  "error": {')
    submit(db_path)
    out = io.StringIO()
    main(["check", "--database", str(db_path)], stdout=out, stderr=err)
    assert out.getvalue().lstrip().startswith('{\n  "ok": true,\n  "check": {')


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_has_a_bar_and_an_estimate(tmp_path: Path) -> None:
    err = _Terminal()
    code = main(["campaign", "--seed", "1", "--output-directory", str(tmp_path / "c")],
                stdout=io.StringIO(), stderr=err)  # fmt: skip
    assert code == EXIT_OK
    lines = err.getvalue().splitlines()
    assert lines[0].startswith("[#")
    assert "case 1/13" in lines[0]
    assert "s left" in lines[0]
    # Each progress line names the experiment, the system and the crash mode; the verdict
    # comes last.
    assert all("campaign sqlite (process): case " in line for line in lines[:-1])
    assert lines[-2].startswith("[####################] campaign sqlite (process): case 13/13")
    assert lines[-1].startswith("crashqueuelab: passed; report: ")
    quiet = _Terminal()
    main(["campaign", "--quiet", "--output-directory", str(tmp_path / "q")],
         stdout=io.StringIO(), stderr=quiet)  # fmt: skip
    assert quiet.getvalue().splitlines() == [
        f"crashqueuelab: passed; report: {tmp_path / 'q' / 'report.html'}"
    ]


def test_the_verdict_is_the_last_thing_a_terminal_shows(tmp_path: Path) -> None:
    """stdout and stderr on one terminal: the JSON first, then the one-line verdict."""
    both = _Terminal()
    code = main(["demo", "--output-directory", str(tmp_path / "d")], stdout=both, stderr=both)
    assert code == EXIT_OK
    text = both.getvalue()
    assert text.rstrip().splitlines()[-1].startswith("crashqueuelab: passed; report: ")
    assert json.loads(text[text.index("{") : text.rindex("}") + 1])["ok"] is True
    both = _Terminal()
    main(["demo", "--output-directory", str(tmp_path / "d")], stdout=both, stderr=both)
    last = both.getvalue().rstrip().splitlines()[-1]
    assert last.startswith("crashqueuelab: not ok: ")
    assert "is not empty" in last


def test_version_names_the_package_python_and_sqlite() -> None:
    out = io.StringIO()
    with pytest.raises(SystemExit) as exited, contextlib.redirect_stdout(out):
        main(["--version"])
    assert exited.value.code == 0
    assert re.fullmatch(r"crashqueuelab \S+ \(Python \S+, SQLite \S+\)\n", out.getvalue())


def _options(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.Action]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += [(f"{name} {option}", each) for option, each in _options(sub)]
        elif action.option_strings and action.dest not in ("help", "version"):
            found.append((action.option_strings[-1], action))
    return found


def test_every_option_has_a_description_and_shows_its_default() -> None:
    parser = build_parser()
    options = _options(parser)
    assert len(options) > 60
    for name, action in options:
        assert action.help, f"{name} has no description"
    formatter = parser._get_formatter()
    for name, action in options:
        shown = formatter._get_help_string(action) or ""
        if action.default not in (None, False) and not action.required:
            assert "default" in shown, f"{name} does not show its default: {shown!r}"
