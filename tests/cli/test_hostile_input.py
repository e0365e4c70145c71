"""Hostile input never yields a traceback: generated argv for every database command and
generated lines for walqueue's CLI. Each answer is one JSON object per reply, the exit code
is a documented one, and nothing changes unless the command succeeded."""

from __future__ import annotations

import io
import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crashqueuelab import DurableQueue, ManualClock
from crashqueuelab.cli import EXIT_OK, EXIT_REJECTED, EXIT_STORE, EXIT_USAGE
from tests.conftest import RunCli, fingerprint
from walqueue import cli as walqueue_cli

# Text as an attacker (or a shell) may send it: lone surrogates included, as Python makes
# of bytes that are not UTF-8.
TEXT = st.text(alphabet=st.characters(exclude_categories=()), max_size=30)
NUMBERS = st.integers(min_value=-(2**80), max_value=2**80).map(str)
NESTED = st.integers(min_value=1, max_value=5000).map(lambda n: '{"a":' * n + "1" + "}" * n)
HUGE = st.integers(min_value=1, max_value=6000).map(lambda n: '{"a":' + "9" * n + "}")
VALUES = st.one_of(
    TEXT, NUMBERS, NESTED, HUGE, st.just(""), st.just("x" * 100_000), st.just('{"k":"\\ud800"}')
)
OPTIONS = {
    "submit": ["--idempotency-key", "--job-type", "--payload", "--max-attempts", "--now-us"],
    "claim": ["--worker-id", "--lease-duration-us", "--limit", "--now-us"],
    "heartbeat": ["--job-id", "--worker-id", "--lease-token", "--lease-duration-us"],
    "succeed": ["--job-id", "--worker-id", "--lease-token"],
    "fail": ["--job-id", "--worker-id", "--lease-token", "--error", "--retry-base-us"],
    "promote": ["--now-us"],
    "recover": ["--now-us", "--retry-max-us"],
    "history": ["--job-id"],
    "replay": ["--job-id"],
    "check": [],
}
SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@st.composite
def argv(draw: st.DrawFn) -> list[str]:
    command = draw(st.sampled_from(sorted(OPTIONS)))
    chosen = draw(st.lists(st.sampled_from([*OPTIONS[command], "--bogus"]), max_size=5))
    parts = [command]
    for option in chosen:
        parts += [option, draw(VALUES)]
    return parts


@SETTINGS
@given(arguments=argv())
def test_every_database_command_answers_hostile_argv_with_one_json_object(
    tmp_path: Path, run_cli: RunCli, arguments: list[str]
) -> None:
    database = tmp_path / "queue.sqlite"
    if not database.exists():
        with DurableQueue(database, clock=ManualClock(1_000_000)) as queue:
            queue.submit(idempotency_key="k", job_type="t", payload={"n": 1})
    before = fingerprint(database)
    outcome = run_cli(*arguments[:1], "--database", str(database), *arguments[1:])
    assert outcome.code in (EXIT_OK, EXIT_REJECTED, EXIT_USAGE, EXIT_STORE)
    assert isinstance(outcome.result, dict)
    assert "Traceback" not in outcome.stderr
    if outcome.code != EXIT_OK:
        assert fingerprint(database) == before


LINE_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=10,
)
OPS = st.sampled_from(["put", "put_many", "reserve", "ack", "release", "get", "stats", "x"])
LINES = st.one_of(
    st.builds(lambda op, args: json.dumps({"op": op, **args}), OPS,
              st.dictionaries(st.sampled_from(["task_id", "payload", "worker", "now",
                                               "lease_seconds", "limit", "items", "lease"]),
                              LINE_VALUES, max_size=4)),
    TEXT,
    NESTED,
)  # fmt: skip


@SETTINGS
@given(lines=st.lists(LINES, min_size=1, max_size=6))
def test_walqueue_answers_every_hostile_line_with_one_json_line(
    tmp_path: Path, lines: list[str]
) -> None:
    lines = [line.replace("\n", " ").replace("\r", " ") for line in lines]
    text = "".join(line + "\n" for line in lines)
    out = io.StringIO()
    code = walqueue_cli.main([str(tmp_path / "q")], stdin=io.StringIO(text), stdout=out)
    assert code == walqueue_cli.EXIT_OK
    replies = [json.loads(line) for line in out.getvalue().split("\n") if line]
    assert len(replies) == sum(1 for line in lines if line.strip())
    assert all(isinstance(reply, dict) and "ok" in reply for reply in replies)
