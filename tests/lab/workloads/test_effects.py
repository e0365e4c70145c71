"""The effect ledger: idempotent and non-idempotent destinations, counted from their rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from crashqueuelab import InvalidInput, ManualClock, StoreError
from crashqueuelab.lab.faults.hooks import InjectedCrash, raise_at
from crashqueuelab.lab.workloads.effects import Destination, EffectLedger
from tests.conftest import fingerprint


def apply(ledger: EffectLedger, key: str = "k", attempt: int = 1) -> bool:
    return ledger.apply(effect_key=key, value=7, job_id="j", attempt=attempt, worker_id="w").applied


def test_an_idempotent_destination_records_one_effect_per_key(tmp_path: Path) -> None:
    with EffectLedger(
        tmp_path / "e.sqlite", destination=Destination.IDEMPOTENT, clock=ManualClock(1)
    ) as ledger:
        assert apply(ledger) is True
        assert apply(ledger, attempt=2) is False
        assert apply(ledger, key="other") is True
        assert ledger.effect_count("k") == 1
        assert ledger.counts_by_key() == {"k": 1, "other": 1}
        assert ledger.absorbed_count() == 1


def test_a_non_idempotent_destination_records_every_application(tmp_path: Path) -> None:
    with EffectLedger(tmp_path / "e.sqlite", destination=Destination.NON_IDEMPOTENT) as ledger:
        results = [
            ledger.apply(effect_key="k", value=1, job_id="j", attempt=n, worker_id="w")
            for n in (1, 2, 3)
        ]
        assert [r.applied for r in results] == [True, True, True]
        assert [r.effect_count for r in results] == [1, 2, 3]
        assert ledger.absorbed_count() == 0


def test_a_ledger_keeps_its_destination(tmp_path: Path) -> None:
    path = tmp_path / "e.sqlite"
    EffectLedger(path, destination=Destination.IDEMPOTENT).close()
    with pytest.raises(StoreError, match="idempotent"):
        EffectLedger(path, destination=Destination.NON_IDEMPOTENT)
    ledger = EffectLedger(path, destination=Destination.IDEMPOTENT)
    ledger.close()
    ledger.close()
    with pytest.raises(StoreError, match="closed"):
        ledger.effect_count("k")


def test_a_crash_inside_the_effect_transaction_leaves_no_effect(tmp_path: Path) -> None:
    path = tmp_path / "e.sqlite"
    with EffectLedger(
        path, destination=Destination.NON_IDEMPOTENT, hook=raise_at("BEFORE_EFFECT_COMMIT")
    ) as ledger:
        before = fingerprint(path)
        with pytest.raises(InjectedCrash):
            apply(ledger)
        assert fingerprint(path) == before
        assert ledger.effect_count("k") == 0


def test_a_crash_after_the_effect_commit_keeps_the_effect(tmp_path: Path) -> None:
    with EffectLedger(
        tmp_path / "e.sqlite",
        destination=Destination.NON_IDEMPOTENT,
        hook=raise_at("AFTER_EFFECT_COMMIT"),
    ) as ledger:
        with pytest.raises(InjectedCrash):
            apply(ledger)
        assert ledger.effect_count("k") == 1


@pytest.mark.parametrize(
    "arguments",
    [{"effect_key": ""}, {"value": "7"}, {"job_id": ""}, {"attempt": 0}, {"worker_id": ""}],
)
def test_bad_effects_are_refused(tmp_path: Path, arguments: dict[str, object]) -> None:
    with EffectLedger(tmp_path / "e.sqlite", destination=Destination.IDEMPOTENT) as ledger:
        request: dict[str, object] = {
            "effect_key": "k", "value": 1, "job_id": "j", "attempt": 1, "worker_id": "w"
        }  # fmt: skip
        request.update(arguments)
        with pytest.raises(InvalidInput):
            ledger.apply(**request)  # type: ignore[arg-type]
        assert ledger.counts_by_key() == {}
