"""What PostgreSQL 15's documentation promises of each ``synchronous_commit`` level when the
primary fails over to its synchronous standby, and what Redis's documentation promises of
its replication under Sentinel (asynchronous, or with ``min-replicas-to-write``), quoted,
with the page each says so on.

Every run names its level and is judged against that level's promise: a loss the level
allows is documented, not a bug; a loss under a level that promises none is a broken promise.
"""

from __future__ import annotations

from typing import Any

#: The levels of ``synchronous_commit``, from the one that waits least to the most.
LEVELS = ("off", "local", "remote_write", "on", "remote_apply")
#: The levels whose commits wait for the synchronous standby.
WAITING_LEVELS = frozenset({"remote_write", "on", "remote_apply"})
#: Which standby a failover promotes when the primary has two: the one that received the most
#: WAL (what an HA manager such as Patroni compares before it promotes), or the one whose
#: link was cut (a failover that promotes a standby chosen beforehand, whatever it holds).
MOST_ADVANCED, LAGGING = "most-advanced", "lagging"
#: How many standbys a primary may have here.
MAX_STANDBYS = 2
PROMOTIONS = (MOST_ADVANCED, LAGGING)
#: Redis's replication settings under Sentinel.
ASYNCHRONOUS, MIN_REPLICAS, WAIT = "asynchronous", "min-replicas", "wait"
REDIS_SETTINGS = (ASYNCHRONOUS, MIN_REPLICAS, WAIT)

WAL_SETTINGS = "https://www.postgresql.org/docs/15/runtime-config-wal.html#GUC-SYNCHRONOUS-COMMIT"
STANDBY_NAMES = (
    "https://www.postgresql.org/docs/15/runtime-config-replication.html"
    "#GUC-SYNCHRONOUS-STANDBY-NAMES"
)
HA_PLANNING = "https://www.postgresql.org/docs/15/warm-standby.html#SYNCHRONOUS-REPLICATION-HA"

_PROMISES: dict[str, tuple[bool, str]] = {
    "off": (
        True,
        "In off mode, there is no waiting, so there can be a delay between when success is"
        " reported to the client and when the transaction is later guaranteed to be safe"
        " against a server crash.",
    ),
    "local": (
        True,
        "The setting local causes commits to wait for local flush to disk, but not for"
        " replication. This is usually not desirable when synchronous replication is in use,"
        " but is provided for completeness.",
    ),
    "remote_write": (
        False,
        "When set to remote_write, commits will wait until replies from the current"
        " synchronous standby(s) indicate they have received the commit record of the"
        " transaction and written it to their file systems. This setting ensures data"
        " preservation if a standby instance of PostgreSQL crashes, but not if the standby"
        " suffers an operating-system-level crash because the data has not necessarily"
        " reached durable storage on the standby.",
    ),
    "on": (
        False,
        "When set to on, commits wait until replies from the current synchronous"
        " standby(s) indicate they have received the commit record of the transaction and"
        " flushed it to durable storage. This ensures the transaction will not be lost unless"
        " both the primary and all synchronous standbys suffer corruption of their database"
        " storage.",
    ),
    "remote_apply": (
        False,
        "When set to remote_apply, commits will wait until replies from the current"
        " synchronous standby(s) indicate they have received the commit record of the"
        " transaction and applied it, so that it has become visible to queries on the"
        " standby(s), and also written to durable storage on the standbys.",
    ),
}

#: What the documentation says of a primary that restarts while commits wait for the standby.
WAITING_COMMITS = (
    "If primary restarts while commits are waiting for acknowledgment, those waiting"
    " transactions will be marked fully committed once the primary database recovers. There"
    " is no way to be certain that all standbys have received all outstanding WAL data at"
    " time of the crash of the primary. Some transactions may not show as committed on the"
    " standby, even though they show as committed on the primary. The guarantee we offer is"
    " that the application will not receive explicit acknowledgment of the successful commit"
    " of a transaction until the WAL data is known to be safely received by all the"
    " synchronous standbys."
)

#: What the documentation says a commit waits for when the primary has several standbys.
QUORUM = (
    "There will be one or more active synchronous standbys; transactions waiting for commit"
    " will be allowed to proceed after these standby servers confirm receipt of their data."
    " ... num_sync is the number of synchronous standbys that transactions need to wait for"
    " replies from"
)


REDIS_REPLICATION = "https://redis.io/docs/latest/operate/oss_and_stack/management/replication/"
_REDIS_PROMISES: dict[str, str] = {
    ASYNCHRONOUS: "Redis uses by default asynchronous replication ... acknowledged writes can"
    " still be lost during a failover, depending on the exact configuration of the Redis"
    " persistence.",
    MIN_REPLICAS: "because Redis uses asynchronous replication it is not possible to ensure the"
    " replica actually received a given write, so there is always a window for data loss."
    " ... You may think of it as a best effort data safety mechanism, where consistency is"
    " not ensured for a given write, but at least the time window for data loss is restricted"
    " to a given number of seconds.",
    WAIT: "Note that WAIT does not make Redis a strongly consistent store: while synchronous"
    " replication is part of a replicated state machine, it is not the only thing needed."
    " However in the context of Sentinel or Redis Cluster failover, WAIT improves the real"
    " world data safety. Specifically if a given write is transferred to one or more"
    " replicas, it is more likely (but not guaranteed) that if the master fails, we'll be able"
    " to promote, during a failover, a replica that received the write ... However this is"
    " just a best-effort attempt so it is possible to still lose a write synchronously"
    " replicated to multiple replicas.",
}
#: Where each Redis setting's words are.
_REDIS_SOURCES = {WAIT: "https://redis.io/docs/latest/commands/wait/"}


def promise_of(level: str, standbys: int = 1, promote: str = MOST_ADVANCED) -> dict[str, Any]:
    """The level's promise at a failover: whether it allows an acknowledged commit to be
    lost, the documentation's words, and where they are. With two standbys and
    ``ANY 1 (*)`` a waiting commit waits for one of them: a failover that promotes the one
    whose link was cut (``LAGGING``) may promote one the commit never waited for, which the
    promise does not cover; promoting the one that received the most keeps it."""
    if level in _REDIS_PROMISES:
        return {
            "setting": level,
            "allows_loss": True,
            "quoted": _REDIS_PROMISES[level],
            "source": _REDIS_SOURCES.get(level, REDIS_REPLICATION),
        }
    allows_loss, quoted = _PROMISES[level]
    setting = f"synchronous_commit={level}"
    if standbys > 1:
        setting += f", synchronous_standby_names='ANY 1 (*)' over {standbys} standbys"
    promise: dict[str, Any] = {
        "setting": setting,
        "allows_loss": allows_loss,
        "quoted": quoted,
        "source": WAL_SETTINGS,
        "waiting_commits": WAITING_COMMITS,
        "waiting_commits_source": HA_PLANNING,
    }
    if standbys > 1:
        promise["promotes"] = promote
        promise["quorum"] = QUORUM
        promise["quorum_source"] = STANDBY_NAMES
        if promote == LAGGING:
            # The commit waited for one standby; the failover promoted the other.
            promise["allows_loss"] = True
            promise["why_allowed"] = (
                "a commit waited for the other standby, and the promise covers only the"
                " standbys it waited for"
            )
    return promise


#: RabbitMQ's queue types on a cluster, and what its documentation promises of each. The
#: 3.13 guides are the last to document classic mirroring (removed in 4.0); their text of
#: these promises is 3.10's.
QUORUM_QUEUES = "https://www.rabbitmq.com/docs/3.13/quorum-queues#data-safety"
MIRRORING = "https://www.rabbitmq.com/docs/3.13/ha#behaviour"
UNSYNCHRONISED_PROMOTION = "https://www.rabbitmq.com/docs/3.13/ha#promoting-unsynchronised-mirrors"
REQUEUEING = "https://www.rabbitmq.com/docs/3.13/confirms#automatic-requeueing"
QUORUM_PROMISE = (
    "Quorum queues are designed to provide data safety under network partition and failure"
    " scenarios. A message that was successfully confirmed back to the publisher using the"
    " publisher confirms feature should not be lost as long as at least a majority of"
    " RabbitMQ nodes hosting the quorum queue are not permanently made unavailable."
)
MIRRORED_PROMISE = (
    "The longest running mirror is promoted to leader, the assumption being that it is most"
    " likely to be fully synchronised with the leader. If there is no mirror that is"
    " synchronised with the leader, messages that only existed on leader will be lost."
    " ... in the case of publisher confirms, a message will only be confirmed to the"
    " publisher when it has been accepted by all of the mirrors."
)
UNSYNCHRONISED_PROMISE = (
    "By default if a queue's leader node fails, loses connection to its peers or is removed"
    " from the cluster, the oldest mirror will be promoted to be the new leader. In some"
    " circumstances this mirror can be unsynchronised, which will cause data loss. ... When"
    " set to when-synced, it will make sure that unsynchronised mirrors are not promoted."
)
MIRRORED_REDELIVERY = (
    "It requeues all messages that have been delivered to clients but are pending"
    " acknowledgement. This can include messages for which a client has issued"
    " acknowledgements, say, if an acknowledgement was either lost on the wire before reaching"
    " the node hosting queue leader, or it was lost when broadcast from the leader to the"
    " mirrors. ... clients that re-consume from the queue must be aware that they are likely"
    " to subsequently receive messages that they have already received."
)
REDELIVERY = (
    "When manual acknowledgements are used, any delivery (message) that was not acked is"
    " automatically requeued when the channel (or connection) on which the delivery happened"
    " is closed. ... Due to this behavior, consumers must be prepared to handle redeliveries"
    " and otherwise be implemented with idempotence in mind."
)


#: When RabbitMQ confirms a publish: the 3.13 guide, as above (the unversioned guide of the
#: 3.10 era has the same sentences).
CONFIRMS = "https://www.rabbitmq.com/docs/3.13/confirms#when-publishes-are-confirmed"
CONFIRMS_LATENCY = "https://www.rabbitmq.com/docs/3.13/confirms#publisher-confirms-latency"
CONFIRM_PROMISE = (
    "For routable messages, the basic.ack is sent when a message has been accepted by all the"
    " queues. For persistent messages routed to durable queues, this means persisting to"
    " disk. For quorum queues, this means that a quorum replicas have accepted and confirmed"
    " the message to the elected leader. ... basic.ack for a persistent message routed to a"
    " durable queue will be sent after persisting the message to disk."
)


def rabbit_promise(queue_type: str, sync_mode: str, promote_on_failure: str) -> dict[str, Any]:
    """What RabbitMQ's documentation promises of ``queue_type`` when the node hosting its
    leader dies: a confirmed message is never lost from a quorum queue unless a majority of
    its nodes is gone for good (every killed node is started again here); a mirrored queue
    loses only what its promoted
    mirror lacked, which a synchronised mirror does not (``lost_only_unsynchronised``). A
    delivery acknowledged and delivered again is documented for both: AMQP 0-9-1 answers
    no acknowledgement, and consumers must be idempotent."""
    if queue_type == "quorum":
        return {
            "setting": "quorum queue (x-queue-type: quorum), 3 members",
            "allows_loss": False,
            "quoted": QUORUM_PROMISE,
            "source": QUORUM_QUEUES,
            "redelivery": REDELIVERY,
            "redelivery_source": REQUEUEING,
        }
    setting = (
        f"classic mirrored queue (ha-mode: all, ha-sync-mode: {sync_mode},"
        f" ha-promote-on-failure: {promote_on_failure}, ha-promote-on-shutdown: when-synced)"
    )
    return {
        "setting": setting,
        # Only where no mirror was synchronised at the failover, and only if RabbitMQ may
        # promote such a mirror: the judge decides per failover.
        "allows_loss": promote_on_failure == "always",
        "lost_only_unsynchronised": True,
        "quoted": MIRRORED_PROMISE,
        "source": MIRRORING,
        "unsynchronised": UNSYNCHRONISED_PROMISE,
        "unsynchronised_source": UNSYNCHRONISED_PROMOTION,
        "redelivery": MIRRORED_REDELIVERY,
        "redelivery_source": MIRRORING,
    }


#: RabbitMQ's guide to partitions, as of 3.10 (its text unchanged through 3.13).
PARTITIONS = "https://www.rabbitmq.com/docs/3.13/partitions"
PARTITION_DETECTED = (
    "Nodes determine if its peer is down if another node is unable to contact it for a"
    " period of time, 60 seconds by default. If two nodes come back into contact, both having"
    " thought the other is down, the nodes will determine that a partition has occurred."
)
QUORUM_PARTITION = (
    "Quorum queues will elect a new leader on the majority side. Quorum queue replicas on the"
    " minority side will no longer make progress (i.e. accept new messages, deliver to"
    " consumers, etc), all this work will be done by the new leader."
)
#: What each ``cluster_partition_handling`` does, and what it says of a mirrored queue's data.
PARTITION_HANDLING_WORDS = {
    "ignore": (
        "Classic mirrored queues which are split across the partition will end up with one"
        " leader on each side of the partition, again with both sides acting independently."
        " ... Unless a partition handling strategy, such as pause_minority, is configured to"
        " be used, the split will continue even after network connectivity is restored. ..."
        " To recover from a split-brain, first choose one partition which you trust the most."
        " This partition will become the authority for the state of the system (schema,"
        " messages) to use; any changes which have occurred on other partitions will be lost."
        " ... Stop all nodes in the other partitions, then start them all up again."
    ),
    "pause_minority": (
        "In pause-minority mode RabbitMQ will automatically pause cluster nodes which"
        " determine themselves to be in a minority (i.e. fewer or equal than half the total"
        " number of nodes) after seeing other nodes go down. ... This configuration prevents"
        " split-brain and is therefore able to automatically recover from network partitions"
        " without inconsistencies."
    ),
    "autoheal": (
        "In autoheal mode RabbitMQ will automatically decide on a winning partition if a"
        " partition is deemed to have occurred, and will restart all nodes that are not in the"
        " winning partition. ... autoheal: appropriate when are more concerned with continuity"
        " of service than with data consistency across nodes."
    ),
}


def rabbit_partition_promise(
    queue_type: str, sync_mode: str, promote_on_failure: str, handling: str
) -> dict[str, Any]:
    """What RabbitMQ's documentation promises of ``queue_type`` when the node hosting its
    leader is cut from the others and the cluster handles the partition by ``handling``.

    A quorum queue: no confirmed message lost (the majority elects a leader, the minority
    makes no progress). A mirrored queue: with ``ignore`` and ``autoheal`` the documentation
    gives up the other side's changes (a leader on each side; the losers restarted), so a
    loss is documented; with ``pause_minority`` it promises no split brain, so only what a
    promoted unsynchronised mirror lacked may go, as at a node's death."""
    promise = rabbit_promise(queue_type, sync_mode, promote_on_failure)
    promise["setting"] += f", cluster_partition_handling: {handling}"
    promise["partition"] = f"{PARTITION_DETECTED} {PARTITION_HANDLING_WORDS[handling]}"
    promise["partition_source"] = PARTITIONS
    if queue_type == "quorum":
        promise["quoted"] = f"{promise['quoted']} {QUORUM_PARTITION}"
        return promise
    if handling in ("ignore", "autoheal"):
        promise["allows_loss"] = True
        promise["lost_only_unsynchronised"] = False
        promise["why_allowed"] = (
            "a leader on each side of the partition, and the changes of the side that loses"
            " are given up when it rejoins"
        )
    return promise
