"""A model workload's chain of events reads as a person tells it: leases by the few first
characters that tell them apart, never 32 hexadecimal digits in a row."""

from __future__ import annotations

import json
from pathlib import Path

from crashqueuelab.lab.pages.chains import observation_chain

FIRST, SECOND = "6ce143f445c545b5a0bebab0bf04d4ff", "6ce1aa0000c545b5a0bebab0bf04d4ff"


def test_leases_in_a_chain_are_shortened_to_what_tells_them_apart(tmp_path: Path) -> None:
    log = tmp_path / "observations.jsonl"
    lines = [
        {"t": 0, "op": "submit", "key": "model-14", "max_attempts": 3, "job_id": "model-14"},
        {"t": 0, "op": "claim", "worker": "worker-b", "key": "model-14", "token": FIRST,
         "deadline": 5_000_000, "attempt": 1},
        {"t": 5_000_001, "op": "claim", "worker": "worker-b", "key": "model-14", "token": SECOND,
         "deadline": 10_000_001, "attempt": 2, "batch": True},
        {"t": 5_000_001, "op": "ack", "worker": "worker-b", "key": "model-14", "token": FIRST,
         "verdict": "succeeded"},
    ]  # fmt: skip
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    rows = observation_chain(log, {"model-14": {"status": "succeeded", "attempts": 2}})
    assert rows[1]["told"] == "lease 6ce14…, attempt 1, until 5 s"
    assert rows[2]["told"] == "lease 6ce1a…, attempt 2, until 10.000001 s"
    assert rows[3]["what"] == "acknowledged model-14 under lease 6ce14…"
    assert FIRST not in json.dumps(rows)
