"""PostgreSQL's data directory on the power-loss disk under a failed WAL fsync: the server
PANICs, comes back by its own crash recovery, and what the queue then tells its caller is
on the disk after a cut (docs/power-loss.md#disk-faults)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from crashqueuelab.lab.campaign.diskfaults import PASSED, run_disk_faults
from crashqueuelab.servers.postgres import find_binaries
from crashqueuelab.systems.postgres import postgres_system

pytestmark = [
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or not os.path.exists("/dev/fuse"),
        reason="power loss needs Linux with /dev/fuse; the command exits 4 and says so",
    ),
    pytest.mark.skipif(find_binaries() is None, reason="no PostgreSQL binaries"),
]


def test_a_failed_wal_fsync_never_acknowledges_what_the_disk_lost(tmp_path: Path) -> None:
    record = run_disk_faults(postgres_system(), "eio-fsync", tmp_path / "run", count=1, steps=(0,))
    [case] = record["cases"]
    assert case["verdict"] == PASSED, case["anomalies"]
    assert case["errors_answered"] == 1
    # The fsync's writes were dropped (fsyncgate), and the server went through a PANIC.
    assert case["recovered"]["writes_dropped_by_failed_fsync"] >= 1
    log = (tmp_path / "run" / "eio-fsync" / "01-submit-a" / "recovered" / "server.log").read_text()
    assert "PANIC:  could not fdatasync file" in log
