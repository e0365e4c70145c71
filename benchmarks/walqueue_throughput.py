"""walqueue on this disk, in one run: per-transaction rate of both segment formats (the
seed's appended frames, the default, and ``preallocate=True``) against raw sync loops,
batched puts, reopening a long WAL, and what compaction leaves behind.

    python benchmarks/walqueue_throughput.py [--seconds 3] [--reopen-transactions 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from walqueue import Queue
from walqueue.codec import encode_frame


def interleaved_rates(directory: Path, seconds: float, slices: int = 6) -> dict[str, float]:
    """Per second: raw append+fsync, raw overwrite+fdatasync of a preallocated file, and
    walqueue's single puts in each format, measured in alternating slices.

    The first raw loop appends a frame-sized record and fsyncs: what the seed's format does,
    and the target's reference. The second writes the same record over zeros synced
    beforehand and fdatasyncs, which is what ``preallocate=True`` does: the physical limit of
    that technique. Alternating short slices exposes all four to the same disk weather, so
    their ratios are fair.
    """
    record = encode_frame({"seq": 1, "type": "put", "tasks": [{"task_id": "t" * 8}]})
    append_fd = os.open(directory / "raw.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    overwrite_fd = os.open(directory / "raw-preallocated.bin", os.O_WRONLY | os.O_CREAT, 0o644)
    room = 64 * 1024 * 1024
    os.pwrite(overwrite_fd, bytes(room), 0)
    os.fsync(overwrite_fd)
    counts = {"append": 0, "overwrite": 0, "put": 0, "put_preallocated": 0}
    times = dict.fromkeys(counts, 0.0)
    offset = 0

    def append() -> None:
        os.write(append_fd, record)
        os.fsync(append_fd)

    def overwrite() -> None:
        nonlocal offset
        os.pwrite(overwrite_fd, record, offset)
        os.fdatasync(overwrite_fd)
        offset = (offset + len(record)) % (room - len(record))

    try:
        with (
            Queue(directory / "single") as queue,
            Queue(directory / "single-preallocated", preallocate=True) as preallocated,
        ):

            def put() -> None:
                queue.put(f"task-{counts['put']}", {"n": counts["put"]})

            def put_preallocated() -> None:
                count = counts["put_preallocated"]
                preallocated.put(f"task-{count}", {"n": count})

            steps = (
                ("append", append),
                ("overwrite", overwrite),
                ("put", put),
                ("put_preallocated", put_preallocated),
            )
            for _ in range(slices):
                for name, step in steps:
                    started = time.perf_counter()
                    deadline = started + seconds / slices / len(steps)
                    while time.perf_counter() < deadline:
                        step()
                        counts[name] += 1
                    times[name] += time.perf_counter() - started
    finally:
        os.close(append_fd)
        os.close(overwrite_fd)
    return {name: counts[name] / times[name] for name in counts}


def batched_put_rate(directory: Path, frames: int, per_frame: int = 100) -> float:
    """put_many with ``per_frame`` tasks in each transaction."""
    with Queue(directory) as queue:
        started = time.perf_counter()
        for frame in range(frames):
            queue.put_many(
                [{"task_id": f"t-{frame}-{n}", "payload": {"n": n}} for n in range(per_frame)]
            )
        return frames * per_frame / (time.perf_counter() - started)


def reopen_seconds(directory: Path, transactions: int) -> tuple[float, dict[str, Any]]:
    """Write ``transactions`` one-task frames (fsync amortised away by writing them in one
    go through the public API is impossible, so they are appended as real frames), then time
    a cold reopen that validates and replays all of them."""
    directory.mkdir()
    segment = directory / "wal-00000000000000000001.log"
    with segment.open("wb") as handle:
        for seq in range(1, transactions + 1):
            task = {
                "task_id": f"t{seq}",
                "key": f"t{seq}",
                "payload": {"n": seq},
                "available_at": 0,
                "max_attempts": 3,
            }
            handle.write(encode_frame({"seq": seq, "type": "put", "tasks": [task]}))
        handle.flush()
        os.fsync(handle.fileno())
    started = time.perf_counter()
    with Queue(directory) as queue:
        elapsed = time.perf_counter() - started
        stats = queue.stats()
    return elapsed, stats


def compaction_leftovers(directory: Path) -> list[str]:
    with Queue(directory) as queue:
        for n in range(50):
            queue.put(f"c{n}", {})
        queue.compact()
    return sorted(path.name for path in directory.iterdir())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=3.0, help="per system, in slices")
    parser.add_argument("--reopen-transactions", type=int, default=100_000)
    parser.add_argument("--batched-frames", type=int, default=500)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="walqueue-bench-") as scratch:
        root = Path(scratch)
        rates = interleaved_rates(root, args.seconds * 4)
        batched = batched_put_rate(root / "batched", args.batched_frames)
        reopen, stats = reopen_seconds(root / "reopen", args.reopen_transactions)
        leftovers = compaction_leftovers(root / "compacted")
    result = {
        "raw_append_fsync_per_s": rates["append"],
        "raw_preallocated_fdatasync_per_s": rates["overwrite"],
        "single_put_transactions_per_s": rates["put"],
        "single_put_preallocated_transactions_per_s": rates["put_preallocated"],
        "single_vs_raw": rates["put"] / rates["append"],
        "single_preallocated_vs_raw_preallocated": rates["put_preallocated"] / rates["overwrite"],
        "single_preallocated_vs_single": rates["put_preallocated"] / rates["put"],
        "put_many_100_tasks_per_s": batched,
        "reopen_transactions": args.reopen_transactions,
        "reopen_seconds": reopen,
        "reopen_last_seq": stats["last_seq"],
        "files_after_compaction": leftovers,
    }
    print(json.dumps(result, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
