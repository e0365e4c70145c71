"""What taskiq and taskiq-redis document of themselves: where they are weaker than the lab's
contract.

taskiq-redis's README promises the stream broker's durability: "This broker **supports**
acknowledgements and therefore is fine to use in cases when data durability is required."
taskiq acknowledges a message when its result is saved (``--ack-type``, default
``when_saved``). What neither has, the adapter does not pretend (``documented``): no token,
so a late completion is accepted; no lease and no heartbeat: a delivered entry is pending for
its consumer until it is acknowledged, and from 1.0.6 (pull request 82) another consumer's
``XAUTOCLAIM`` takes it once it has been idle ``idle_timeout`` on Redis's clock, whether its
holder died or still runs it. Before 1.0.6 nothing takes it again: that is no documented
weakness but the bug pull request 82 fixed ("Fixed unacknowledged messages"), so a release
without ``idle_timeout`` is judged without the weakness, and a killed worker's entry left
pending breaks the README's promise.
"""

from __future__ import annotations

from crashqueuelab.judges.findings import Kind
from crashqueuelab.systems.contract import Documented
from crashqueuelab.systems.libraries.redisstore import CONNECTION_RAISES, persistence_losses
from crashqueuelab.systems.libraries.taskiq.client import IDLE_TIMEOUT_MS

_README = "https://github.com/taskiq-python/taskiq-redis#stream"
PULL_82 = "https://github.com/taskiq-python/taskiq-redis/pull/82"
_BROKER_SOURCE = (
    "https://github.com/taskiq-python/taskiq-redis/blob/1.0.6/taskiq_redis/redis_broker.py"
)
_RETRY = "https://taskiq-python.github.io/available-components/middlewares.html"

#: The README's promise, quoted in the report and in docs/real-queues.md.
DURABILITY = (
    '"This broker **supports** acknowledgements and therefore is fine to use in cases when'
    ' data durability is required."'
)

_NO_TOKEN = Documented(
    "no token: taskiq's receiver saves whatever outcome the task it runs returns and"
    " acknowledges the entry, so a late completion is accepted (a stream entry has no claim"
    " of its own to fence: XACK of a pending entry succeeds for any consumer)",
    _README,
    kinds=(
        Kind.LATE_ACKNOWLEDGEMENT_ACCEPTED,
        Kind.ACKNOWLEDGEMENT_AT_DEADLINE_ACCEPTED,
        Kind.LATE_FAILURE_REPORT_ACCEPTED,
        Kind.FAILURE_REPORT_AT_DEADLINE_ACCEPTED,
        Kind.DEAD_HEARTBEAT_ACCEPTED,
    ),
    when={
        Kind.CONTRACT_RULE_FAILED: {
            "point": "an_acknowledgement_at_the_deadline_is_refused",
            "assertion": "an acknowledgement exactly at the lease's deadline answered succeeded*",
        },
    },
)
_IDLE_TIMEOUT = Documented(
    "no lease: a delivered entry stays pending for the consumer that read it (XREADGROUP"
    " hands a consumer every new entry at once, so the ones it has not run yet too) until"
    ' it is acknowledged; idle_timeout, "time in ms to wait before redelivering a message"'
    f" ({IDLE_TIMEOUT_MS} ms here, on Redis's clock, which the lab's clock does not move),"
    " is how long it waits before another consumer's XAUTOCLAIM takes it",
    _BROKER_SOURCE,
    points=(
        "listen:after",
        "BEFORE_EFFECT_COMMIT",
        "AFTER_EFFECT_COMMIT",
        "finish:before",
        "finish:after",
        "retry:before",
    ),
    # Not a chaos run's stall: it waits three reclaims (idle_timeout and a read) past the
    # last acknowledgement, so an entry still pending then is one no consumer reclaimed when
    # idle_timeout says it would (issue 87's lock left held; 1.2.3 on reclaiming only after
    # a read that fetched), never this weakness.
    when={
        Kind.CLAIM_NOT_OFFERED: {"offered": "nothing"},
        Kind.EXPIRED_LAST_ATTEMPT_NOT_DEAD: {"state": "pending"},
        Kind.RECOVERY_UNFINISHED: ({"effect_state": "pending"}, {"flaky_state": "pending"}),
        Kind.EFFECTS_NOT_ONCE: ({"effect_effects": 0}, {"flaky_effects": 0}),
        Kind.UNFINISHED: {"state": "pending"},
        Kind.CONTRACT_RULE_FAILED: {
            "point": "an_expired_holder_is_refused_and_the_job_goes_to_another",
            "assertion": "w2 found nothing to claim",
        },
    },
)
_RECLAIMS_LIVE_HOLDERS = Documented(
    "XAUTOCLAIM takes an entry idle past idle_timeout whether or not its consumer still"
    " runs it: a task longer than idle_timeout is handed out beside its live holder",
    _BROKER_SOURCE,
    when={
        Kind.CLAIMED_WHILE_LEASED: {},
        Kind.OVERLAPPING_LEASES: {},
        Kind.RAN_BESIDE_LIVE_HOLDER: {},
    },
)
_RETRY_AT_ONCE = Documented(
    "SimpleRetryMiddleware kicks a failed task again at once, as a new message with the"
    " same task id: no delay",
    _RETRY,
    when={
        Kind.CONTRACT_RULE_FAILED: {
            "point": "a_failure_waits_its_delay_then_the_dead_letter_takes_it",
            "assertion": "* claimed job * as attempt 2; nothing may be claimable: the retry's"
            " delay has not passed",
        }
    },
)


def documented(reclaims: bool, persistence: str = "rdb") -> tuple[Documented, ...]:
    """taskiq's documented weaknesses at a release, on a server with that persistence:
    ``idle_timeout``'s only where the release has it (taskiq-redis 1.0.6 on); Redis's RDB
    snapshots' losses only at that persistence (``redisstore.persistence_losses``)."""
    always = (_NO_TOKEN, _RETRY_AT_ONCE, *persistence_losses(persistence), CONNECTION_RAISES)
    return (*always, _IDLE_TIMEOUT, _RECLAIMS_LIVE_HOLDERS) if reclaims else always
