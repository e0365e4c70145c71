"""Batch sizes: fixed, or adapted to the handling time a worker measures."""

from __future__ import annotations

import pytest

from crashqueuelab.lab.workloads.batching import AdaptiveBatch, FixedBatch, batch_sizer


def test_a_fixed_batch_never_changes() -> None:
    sizer = FixedBatch(32)
    sizer.observe(jobs=32, work_s=10.0)
    assert sizer.next_size() == 32
    with pytest.raises(ValueError, match="at least one job"):
        FixedBatch(0)


def test_an_adaptive_batch_fits_its_budget_of_handling_time() -> None:
    sizer = AdaptiveBatch(ceiling=256, first=8, budget_s=0.005)
    assert sizer.next_size() == 8
    sizer.observe(jobs=8, work_s=0.008)  # 1 ms a job: five fit in 5 ms
    assert sizer.next_size() == 5
    sizer.observe(jobs=5, work_s=0.005)
    assert sizer.next_size() == 5


def test_jobs_that_cost_nothing_fill_the_ceiling_and_slow_ones_come_alone() -> None:
    sizer = AdaptiveBatch(ceiling=64, first=8, budget_s=0.005)
    sizer.observe(jobs=8, work_s=0.0)
    assert sizer.next_size() == 64
    slow = AdaptiveBatch(ceiling=64, first=8, budget_s=0.005)
    slow.observe(jobs=8, work_s=8 * 0.020)
    assert slow.next_size() == 1


def test_the_handling_time_is_smoothed_so_one_slow_batch_does_not_collapse_the_size() -> None:
    sizer = AdaptiveBatch(ceiling=256, first=10, budget_s=0.010)
    sizer.observe(jobs=10, work_s=0.010)  # 1 ms a job
    assert sizer.next_size() == 10
    sizer.observe(jobs=10, work_s=0.100)  # one batch at 10 ms a job
    # 0.7 * 1 ms + 0.3 * 10 ms = 3.7 ms a job: two fit, not one.
    assert sizer.next_size() == 2
    sizer.observe(jobs=0, work_s=1.0)  # an empty claim teaches nothing
    assert sizer.next_size() == 2


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"ceiling": 0}, "first"),
        ({"first": 300}, "first"),
        ({"budget_s": 0.0}, "budget"),
    ],
)
def test_an_adaptive_batch_refuses_nonsense(arguments: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AdaptiveBatch(**arguments)  # type: ignore[arg-type]


def test_no_size_means_adaptive() -> None:
    assert isinstance(batch_sizer(None), AdaptiveBatch)
    assert batch_sizer(3).next_size() == 3
