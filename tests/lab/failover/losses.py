"""What a failover of an asynchronous (or a lagging) replica loses, asserted from the run's
own ledger: the same for PostgreSQL's standbys and Redis's replicas."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: The run records the cut's time before it tells the proxy to cut, bytes the proxy has
#: already read still go out, and a busy host may note an acknowledgement a while after
#: the server sent it: a write noted within this much after the recorded cut may have
#: reached the replica (seen: one noted 0.9 ms after it, kept), and one noted within this
#: much after the recorded kill may have been the old primary's.
CUT_TAKES_HOLD_S = 0.25
#: How far before the cut the loss may begin: what the replica had not received yet, a
#: few milliseconds of acknowledgements on a healthy link (seen: 11 ms), with the same
#: allowance for a busy host's late notes.
LAG_BEFORE_THE_CUT_S = 0.25


def lost_is_the_tail_from_the_cut(out: Path, record: dict[str, Any]) -> dict[str, float]:
    """Assert that what the failover lost is a run of consecutive acknowledgements by the
    old primary and nothing else: every one from the cut to the primary's death, and
    perhaps the last few before the cut that the promoted replica had not received yet (how
    many depends on the host's load), with what came before them kept. Returns each
    acknowledged enqueue's time, from the run's ledger."""
    lost = {item["key"]: item["acknowledged_at_s"] for item in record["findings"]["lost_enqueues"]}
    failover = record["failovers"][0]
    cut, killed = failover["cut_at_s"], failover["killed_at_s"]
    ledger = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    acknowledged_at = {e["key"]: e["at_s"] for e in ledger if e["event"] == "enqueued"}
    in_the_cut = {
        key for key, at in acknowledged_at.items() if cut + CUT_TAKES_HOLD_S <= at <= killed
    }
    # The producer may have stalled through the cut on a busy host (seen: 0.47 s of a
    # 0.7 s cut): whatever it had acknowledged then is lost, and something was.
    assert lost
    assert in_the_cut <= lost.keys()
    first, last = min(lost.values()), max(lost.values())
    # The old primary acknowledged each of them, none after the promotion; what the promoted
    # replica acknowledged is not lost. An answer the old primary sent just before its kill
    # may be noted just after the recorded kill (seen: 1.3 ms after it, on a loaded host).
    assert last <= killed + CUT_TAKES_HOLD_S, (last, killed)
    assert last < failover["promoted_at_s"], (last, failover["promoted_at_s"])
    assert first >= cut - LAG_BEFORE_THE_CUT_S, (first, cut)
    assert any(at < first for at in acknowledged_at.values())
    assert lost.keys() == {key for key, at in acknowledged_at.items() if first <= at <= last}
    return acknowledged_at
