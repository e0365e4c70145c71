"""Reading the effect ledger a run left on disk, read-only, as plain JSON-ready data.

Reports are built from observations of the retained files, never from what the code that
wrote them believes it wrote. Queue stores are read by their systems' readers
(``lab/runs/readings.py``); this module reads the lab's own ledger.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crashqueuelab.judges.readonly import open_read_only
from crashqueuelab.lab.workloads.effects import LEDGER_SCHEMA


def observe_ledger(path: Path) -> dict[str, Any]:
    """Durable effects per key, and duplicates an idempotent destination absorbed."""
    if not path.is_file():
        return {"exists": False, "effects_by_key": {}, "effects": 0, "absorbed": 0}
    conn = open_read_only(
        path,
        application_id=LEDGER_SCHEMA.application_id,
        versions=(LEDGER_SCHEMA.version,),
        what="crashqueuelab effect ledger",
    )
    try:
        conn.execute("BEGIN")
        by_key = {
            key: int(count)
            for key, count in conn.execute(
                "SELECT effect_key, count(*) FROM effects GROUP BY effect_key ORDER BY effect_key"
            )
        }
        absorbed = int(conn.execute("SELECT count(*) FROM absorbed").fetchone()[0])
        destination = conn.execute("SELECT destination FROM ledger").fetchone()
        conn.execute("COMMIT")
    finally:
        conn.close()
    return {
        "exists": True,
        "destination": None if destination is None else destination[0],
        "effects_by_key": by_key,
        "effects": sum(by_key.values()),
        "absorbed": absorbed,
    }
