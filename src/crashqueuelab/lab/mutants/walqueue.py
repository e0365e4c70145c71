"""walqueue's planted bugs: subclasses of its store, and patches of its own modules that a
mutant client applies only while it opens (recovery and the choice of store class happen
then): a torn final frame refused as corruption, an orphan snapshot trusted, WAL frames
never fsynced, ``CURRENT`` renamed without a directory sync. ``catalog.py`` opens each as a
system of its own and says which evidence must catch it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import walqueue.durability
import walqueue.queue
import walqueue.store
from crashqueuelab.lab.mutants.patching import patched
from walqueue.codec import decode_frames, encode_frame


def torn_tail_refused() -> contextlib.AbstractContextManager[None]:
    """Recovery reads every segment as if no final frame could tear."""

    def strict(
        data: bytes, *, where: str, tail_may_tear: bool, zero_tail: bool = False
    ) -> tuple[list[Any], int]:
        return decode_frames(data, where=where, tail_may_tear=False, zero_tail=zero_tail)

    return patched(walqueue.store, "decode_frames", strict)


def newest_snapshot_trusted() -> contextlib.AbstractContextManager[None]:
    """``CURRENT`` pointed at the newest snapshot file before the store loads it."""

    load = walqueue.store.Store._load_snapshot

    def newest(self: walqueue.store.Store) -> Any:
        snapshots = sorted(self.directory.glob("snapshot-*.json"))
        if snapshots:  # an orphan (CURRENT never named it) is trusted as if published
            seq = int(snapshots[-1].name[len("snapshot-") : -len(".json")])
            pointer = encode_frame({"snapshot": snapshots[-1].name, "seq": seq})
            temporary = self.directory / "CURRENT.mutant"
            temporary.write_bytes(pointer)
            os.replace(temporary, self.directory / walqueue.store.CURRENT)
        return load(self)

    return patched(walqueue.store.Store, "_load_snapshot", newest)


def _no_sync(fd: int) -> None:
    """What the mutant calls instead of syncing a frame: nothing."""


class UnsyncedAppends(walqueue.store.Store):
    """Frames are written to the WAL and never fsynced (creating and renaming files still
    are): a put or an ack returns before it is durable."""

    def append(self, txn: dict[str, Any], frame: bytes | None = None) -> None:
        with patched(walqueue.store, "sync_data", _no_sync):
            super().append(txn, frame)


class CurrentWithoutDirectorySync(walqueue.store.Store):
    """Compaction renames ``CURRENT`` into place and goes on without fsyncing the directory,
    so the deletion of the segments the new snapshot covers may reach the disk first."""

    def compact(self, state: Any) -> int:
        hook, phases = self.hook, [""]

        def remembering(phase: str) -> None:
            phases.append(phase)
            hook(phase)

        def unless_current_was_renamed(directory: Path) -> None:
            if phases[-1] != "current:after_rename":
                walqueue.durability.fsync_directory(directory)

        self.hook = remembering
        try:
            with patched(walqueue.store, "fsync_directory", unless_current_was_renamed):
                return super().compact(state)
        finally:
            self.hook = hook


def store_class(store: type[walqueue.store.Store]) -> Callable[[], Any]:
    """The patch under which a client opening walqueue makes its store of ``store``."""
    return lambda: patched(walqueue.queue, "Store", store)
