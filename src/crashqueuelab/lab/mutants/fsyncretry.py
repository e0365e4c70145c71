"""A planted fsyncgate bug: walqueue retrying a failed fsync of its WAL and reporting
success.

After a failed fsync Linux drops the dirty pages it covered; the retry syncs nothing and
answers success, so the put or ack is acknowledged while its frame never reaches the disk.
Only a disk that fails an fsync shows it: the catalog's ``fsync_retried`` is caught by the
disk-fault runs (``crashqueuelab disk-faults --disk-fault eio-fsync --count 1``, one failed
operation per call): walqueue as shipped is told the failure and passes; this mutant is
told success and the judge finds the frame gone after the cut. Run it as ``--system
crashqueuelab.lab.mutants.catalog:fsync_retried``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import walqueue.durability
import walqueue.queue
import walqueue.store
from crashqueuelab.lab.mutants.patching import patched
from crashqueuelab.systems.contract import OpenRequest, System
from crashqueuelab.systems.walqueue import WalqueueClient, walqueue_system


def _retrying_sync(fd: int) -> None:
    """What the mutant calls to sync a frame: a failed sync is tried again, and the second
    answer believed."""
    try:
        walqueue.durability.sync_data(fd)
    except OSError:
        walqueue.durability.sync_data(fd)


class FsyncRetried(walqueue.store.Store):
    """Appends whose failed sync is retried until one succeeds."""

    def append(self, txn: dict[str, Any], frame: bytes | None = None) -> None:
        with patched(walqueue.store, "sync_data", _retrying_sync):
            super().append(txn, frame)


def fsync_retried() -> System:
    """walqueue with ``FsyncRetried`` as its store."""

    class MutantClient(WalqueueClient):
        def __init__(self, request: OpenRequest) -> None:
            with patched(walqueue.queue, "Store", FsyncRetried):
                super().__init__(request)

    return replace(walqueue_system(), name="walqueue-mutant-fsync-retried", open=MutantClient)
