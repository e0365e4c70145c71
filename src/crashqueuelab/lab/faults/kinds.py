"""The faults a run can deliver, by the name its record and its page give them: the lab's
whole vocabulary of how a system is broken (process signals, power, the server, the
network)."""

from __future__ import annotations

from enum import StrEnum


class FaultKind(StrEnum):
    KILL = "SIGKILL"
    PAUSE = "SIGSTOP"
    #: A deploy: a batch of workers gets SIGTERM, a grace period, then SIGKILL of every
    #: process of its session if it is still there (``deploy.py``).
    DEPLOY = "deploy"
    #: Every process dies and the disk loses what nobody synced (power-loss mode only).
    POWER_CUT = "power cut"
    #: The system's server dies (pg_ctl stop -m immediate) and starts again.
    SERVER_RESTART = "server restart"
    #: The primary dies while its standby lags and the standby is promoted; the clients
    #: follow it (``server.py``; a replicated server the run started).
    FAILOVER = "failover"
    #: The standby stops answering, so every COMMIT made meanwhile waits (still in
    #: progress); every client connection is reset while they wait, then the standby comes
    #: back and they end (``server.py``; a replicated server the run started).
    HELD_COMMITS = "commits held open"
    #: A worker's database session is ended by the server (pg_terminate_backend).
    SESSION_KILL = "session terminated"
    #: Network faults on the connections to the server (``network.py``).
    STALL = "stall"
    PARTITION = "partition"
    LOST_REPLIES = "lost replies"
    CONNECTION_RESET = "connection reset"
