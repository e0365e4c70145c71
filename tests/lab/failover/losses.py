"""What a failover of an asynchronous (or a lagging) replica loses, asserted from the run's
own ledger: the same for PostgreSQL's standbys and Redis's replicas."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: The run records the cut's time as it tells the proxy to cut: a write acknowledged within
#: this much after it may still have reached the replica (seen: 0.9 ms after, kept).
CUT_TAKES_HOLD_S = 0.05
#: How far before the cut the loss may begin: what the replica had not received yet, a
#: few milliseconds of acknowledgements on a healthy link (seen: 11 ms), never all of them.
LAG_BEFORE_THE_CUT_S = 1.0


def lost_is_the_tail_from_the_cut(out: Path, record: dict[str, Any]) -> dict[str, float]:
    """Assert that the producer went on during the cut and that what the failover lost is
    every acknowledgement from the first lost one to the promotion, and nothing else: every
    one in the cut, and perhaps the last few before it that the promoted replica had not
    received yet (how many depends on the host's load). Returns each acknowledged enqueue's
    time, from the run's ledger."""
    lost = {item["key"]: item["acknowledged_at_s"] for item in record["findings"]["lost_enqueues"]}
    cut, promoted = record["failovers"][0]["cut_at_s"], record["failovers"][0]["promoted_at_s"]
    ledger = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    acknowledged_at = {e["key"]: e["at_s"] for e in ledger if e["event"] == "enqueued"}
    in_the_cut = {
        key for key, at in acknowledged_at.items() if cut + CUT_TAKES_HOLD_S <= at <= promoted
    }
    assert in_the_cut, (cut, promoted)
    assert in_the_cut <= lost.keys()
    tail_from = min(lost.values())
    assert tail_from >= cut - LAG_BEFORE_THE_CUT_S, (tail_from, cut)
    tail = {key for key, at in acknowledged_at.items() if tail_from <= at <= promoted}
    assert lost.keys() == tail
    return acknowledged_at
