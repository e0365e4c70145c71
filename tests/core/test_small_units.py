"""Clock, ids, retry policy, row decoding, payload parsing and the module entry point."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from crashqueuelab import InvalidInput, ManualClock, RetryPolicy, SeededIds, StoreError
from crashqueuelab.core.clock import SystemClock
from crashqueuelab.core.ids import RandomIds
from crashqueuelab.core.models import (
    Acknowledgement,
    AckResult,
    ClaimedJob,
    Job,
    JobState,
    to_json,
)
from crashqueuelab.core.payloads import parse_payload
from crashqueuelab.core.records import filler
from crashqueuelab.core.rows import decode_job, decode_leased, finished_copy
from crashqueuelab.core.validation import require_name
from crashqueuelab.systems.contract import Claim
from crashqueuelab.systems.sqlite import _claim


@pytest.mark.parametrize("bad", [-1, 1.5, True, "0"])
def test_a_manual_clock_refuses_bad_times(bad: object) -> None:
    with pytest.raises(ValueError, match="non-negative integer"):
        ManualClock(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-negative integer"):
        ManualClock(0).advance(bad)  # type: ignore[arg-type]


def test_a_manual_clock_only_moves_forward_when_told() -> None:
    clock = ManualClock(10)
    assert clock.now_us() == 10
    assert clock.advance(5) == 15
    assert clock.now_us() == 15


def test_the_system_clock_reads_microseconds() -> None:
    assert SystemClock().now_us() > 1_600_000_000 * 1_000_000


def test_seeded_ids_repeat_and_streams_differ() -> None:
    one, two, other = SeededIds(5, "a"), SeededIds(5, "a"), SeededIds(5, "b")
    first = [one.job_id(), one.lease_token()]
    assert first == [two.job_id(), two.lease_token()]
    assert first != [other.job_id(), other.lease_token()]
    assert first[0].startswith("job-")
    assert first[1].startswith("lease-")


def test_random_ids_do_not_repeat() -> None:
    ids = RandomIds()
    assert len({ids.job_id() for _ in range(100)}) == 100
    assert ids.lease_token() != ids.lease_token()


def test_random_job_ids_sort_in_the_order_their_clock_made_them() -> None:
    clock = ManualClock(1_000)
    ids = RandomIds(clock)
    made = []
    for _ in range(50):
        made.append(ids.job_id())
        clock.advance(1)
    assert sorted(made) == made
    # Made at the same microsecond, two ids still differ.
    assert ids.job_id() != ids.job_id()


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"base_delay_us": -1}, "base_delay_us"),
        ({"max_delay_us": 1.5}, "max_delay_us"),
        ({"base_delay_us": 10, "max_delay_us": 5}, "max_delay_us"),
    ],
)
def test_a_retry_policy_refuses_bad_delays(arguments: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        RetryPolicy(**arguments)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_retry_delays_double_up_to_the_cap_even_for_huge_attempt_numbers() -> None:
    policy = RetryPolicy(base_delay_us=3, max_delay_us=20)
    assert [policy.delay_us(n) for n in (1, 2, 3, 4, 10**9)] == [3, 6, 12, 20, 20]
    with pytest.raises(InvalidInput):
        policy.delay_us(0)


def test_an_unknown_state_in_a_row_is_a_store_error() -> None:
    row = ("j", 1, "k", "t", "{}", "x", "LIMBO", 0, 1, 0, None, None, None, None, 0, 0)
    with pytest.raises(StoreError, match="unknown JobState"):
        decode_job(row)
    valid = decode_job((*row[:6], "QUEUED", *row[7:]))
    assert valid.state is JobState.QUEUED
    assert to_json(valid)["payload"] == {}
    assert JobState.SUCCEEDED.is_terminal
    assert not JobState.LEASED.is_terminal


def test_records_built_from_rows_are_the_records_the_dataclass_makes() -> None:
    row = ("j", 1, "k", "t", "{}", "x", "QUEUED", 0, 3, 5, None, None, None, None, 0, 0)
    decoded = decode_job(row)
    made = Job("j", 1, "k", "t", "{}", "x", JobState.QUEUED, 0, 3, 5, None, None, None, None, 0, 0)
    assert (decoded, hash(decoded), repr(decoded)) == (made, hash(made), repr(made))
    with pytest.raises(dataclasses.FrozenInstanceError):
        decoded.attempts = 9  # type: ignore[misc]
    leased = decode_leased(row, worker_id="w", token="t1", deadline=9, now=2)
    assert leased == dataclasses.replace(
        made, state=JobState.LEASED, attempts=1, lease_worker_id="w", lease_token="t1",
        lease_deadline_us=9, updated_at_us=2,
    )  # fmt: skip
    done = finished_copy(leased, state=JobState.SUCCEEDED, now=3)
    assert done == dataclasses.replace(made, state=JobState.SUCCEEDED, attempts=1, updated_at_us=3)
    # The copies share nothing with the record they were made from.
    assert (decoded, leased.state) == (made, JobState.LEASED)


def test_a_claim_made_without_its_init_is_the_claim_the_dataclass_makes() -> None:
    row = ("j", 1, "k", "t", '{"n": 1}', "x", "QUEUED", 0, 3, 5, None, None, None, None, 0, 0)
    leased = decode_leased(row, worker_id="w", token="t1", deadline=9, now=2)
    made = _claim(ClaimedJob(job=leased, lease_token="t1", lease_deadline_us=9, attempt=1), "w")
    expected = Claim(
        job_id="j", key="k", job_type="t", payload={"n": 1}, attempt=1, worker_id="w", token="t1"
    )
    assert (made, hash(made), repr(made)) == (expected, hash(expected), repr(expected))
    assert (made.payload, made.handle) == ({"n": 1}, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.token = "t2"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kind", "values"),
    [
        (Acknowledgement, {"job_id": "j", "worker_id": "w", "lease_token": "t"}),
        (AckResult, {"job_id": "j", "job": None, "stale_reason": "not_leased"}),
        (
            ClaimedJob,
            {
                "job": decode_job(
                    ("j", 1, "k", "t", "{}", "x", "QUEUED", 0, 3, 5, None, None, None, None, 0, 0)
                ),
                "lease_token": "t",
                "lease_deadline_us": 9,
                "attempt": 1,
            },
        ),
    ],
)
def test_every_filled_record_is_the_record_its_init_makes(
    kind: type[object], values: dict[str, object]
) -> None:
    made, expected = filler(kind)(dict(values)), kind(**values)
    assert (made, hash(made), repr(made)) == (expected, hash(expected), repr(expected))
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.job_id = "other"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("job-0001", None),
        ("wörker", None),
        ("a b", None),
        ("", "must not be empty"),
        ("   ", "must not be empty"),
        ("\u2003", "must not be empty"),
        ("a\x00b", "must not contain NUL"),
        ("x" * 512, None),
        ("x" * 513, "longer than 512"),
        ("é" * 513, "longer than 512"),
        ("bad\udcff", "lone surrogate"),
        (7, "must be a string"),
    ],
)
def test_names_are_checked_alike_on_both_paths(value: object, problem: str | None) -> None:
    class Text(str):
        pass

    # A str subclass takes the general path, a plain ASCII str the short one.
    for candidate in (value, Text(value)) if isinstance(value, str) else (value,):
        if problem is None:
            assert require_name("field", candidate) == value
        else:
            with pytest.raises(InvalidInput, match=problem):
                require_name("field", candidate)


@dataclasses.dataclass
class _Open:
    x: int


@dataclasses.dataclass(frozen=True)
class _Checked:
    x: int

    def __post_init__(self) -> None:
        if self.x < 0:
            raise ValueError("negative")


@dataclasses.dataclass(frozen=True, slots=True)
class _Slotted:
    x: int


@pytest.mark.parametrize("kind", [_Open, _Checked, _Slotted, dict])
def test_only_plain_frozen_dataclasses_are_filled_without_init(kind: type[object]) -> None:
    with pytest.raises(TypeError):
        filler(kind)


def test_payload_text_that_is_valid_parses_to_the_object() -> None:
    assert parse_payload('{"b": [1, 2.5, null, true], "a": "é"}') == {
        "b": [1, 2.5, None, True],
        "a": "é",
    }


def test_python_dash_m_runs_the_cli() -> None:
    # A process of its own: under pytest the installed package is imported through pytest's
    # assertion-rewriting hook (its distribution ships a pytest plugin), which runpy cannot use.
    finished = subprocess.run(
        [sys.executable, "-m", "crashqueuelab", "bogus"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert finished.returncode == 2, finished.stderr
    assert json.loads(finished.stdout)["error"]["type"] == "UsageError"


def test_the_package_face_imports_each_public_name_when_first_used() -> None:
    import importlib

    import crashqueuelab

    assert set(crashqueuelab.__all__) == set(crashqueuelab._MODULE_OF)
    for name, module in crashqueuelab._MODULE_OF.items():
        assert getattr(crashqueuelab, name) is getattr(importlib.import_module(module), name)
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        crashqueuelab.Nothing  # noqa: B018
    assert "DurableQueue" in dir(crashqueuelab)
    # A process that needs one module of the lab does not import the queue with it.
    probe = (
        "import sys, crashqueuelab.lab.faults.powerloss.journal;"
        " assert 'crashqueuelab.core.queue' not in sys.modules, 'imported';"
        " from crashqueuelab import DurableQueue;"
        " assert 'crashqueuelab.core.queue' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)


def test_an_install_hint_speaks_as_the_readme_from_a_checkout_and_by_name_elsewhere(
    tmp_path: Path,
) -> None:
    from crashqueuelab.core.errors import install_hint

    assert install_hint("peers", checkout=tmp_path) == "pip install 'crashqueuelab[peers]'"
    (tmp_path / "pyproject.toml").write_text("")
    inside = install_hint("peers", checkout=tmp_path, prefix=str(tmp_path / ".venv"))
    assert inside == ".venv/bin/pip install -e '.[peers]' (from the checkout's root)"
    outside = install_hint("peers", checkout=tmp_path, prefix="/opt/venv")
    assert outside == "/opt/venv/bin/pip install -e '.[peers]' (from the checkout's root)"
