"""Synthetic handlers: jobs whose only work is an effect on a ledger, so effects can be counted."""

from __future__ import annotations

from crashqueuelab.lab.workloads.effects import EffectLedger
from crashqueuelab.lab.workloads.worker import Handler, JobContext

SYNTHETIC_EFFECT = "synthetic.effect"
SYNTHETIC_FLAKY = "synthetic.flaky"


def _effect_fields(context: JobContext) -> tuple[str, int]:
    payload = context.payload
    key, value = payload.get("effect_key"), payload.get("value")
    if not isinstance(key, str) or isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("payload needs a string effect_key and an integer value")
    return key, value


class SyntheticEffect:
    """``synthetic.effect``: optionally heartbeat, then write {effect_key, value} to a ledger.

    Payload: ``effect_key`` (str), ``value`` (int), ``heartbeats`` (int, default 0) lease
    extensions before the effect, as a long job would make (where the system has heartbeats).
    """

    def __init__(self, ledger: EffectLedger) -> None:
        self.ledger = ledger

    def __call__(self, context: JobContext) -> None:
        key, value = _effect_fields(context)
        if context.heartbeat is not None:
            for _ in range(int(context.payload.get("heartbeats", 0))):
                context.heartbeat()
        self.ledger.apply(
            effect_key=key,
            value=value,
            job_id=context.job_id,
            attempt=context.attempt,
            worker_id=context.worker_id,
        )


class FlakyEffect(SyntheticEffect):
    """``synthetic.flaky``: fails its first ``fail_attempts`` attempts, then acts as the effect."""

    def __call__(self, context: JobContext) -> None:
        failures = int(context.payload.get("fail_attempts", 1))
        if context.attempt <= failures:
            raise RuntimeError(f"attempt {context.attempt} fails on purpose")
        super().__call__(context)


def synthetic_handlers(ledger: EffectLedger) -> dict[str, Handler]:
    """The handler registry every experiment uses."""
    return {SYNTHETIC_EFFECT: SyntheticEffect(ledger), SYNTHETIC_FLAKY: FlakyEffect(ledger)}
