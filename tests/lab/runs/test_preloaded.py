"""What a fork server imports last: coverage's measurement of its imports saved once, where
coverage runs, and nothing done where it does not."""

from __future__ import annotations

import sys
import types

import pytest

from crashqueuelab.lab.runs.preloaded import save_what_coverage_measured


class _Measurement:
    def __init__(self) -> None:
        self.saves = 0

    def save(self) -> None:
        self.saves += 1


def _coverage(current: _Measurement | None) -> types.ModuleType:
    module = types.ModuleType("coverage")
    module.Coverage = types.SimpleNamespace(current=lambda: current)  # type: ignore[attr-defined]
    return module


def test_a_running_measurement_is_saved_once(monkeypatch: pytest.MonkeyPatch) -> None:
    measurement = _Measurement()
    monkeypatch.setitem(sys.modules, "coverage", _coverage(measurement))
    assert save_what_coverage_measured() is True
    assert measurement.saves == 1


def test_without_coverage_or_a_measurement_nothing_is_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "coverage", _coverage(None))
    assert save_what_coverage_measured() is False
    monkeypatch.delitem(sys.modules, "coverage")
    assert save_what_coverage_measured() is False
    # Never imported here: a fork server outside the gates does not load coverage.
    assert "coverage" not in sys.modules
