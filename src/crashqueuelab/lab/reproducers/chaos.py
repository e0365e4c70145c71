"""A not-ok chaos run's fault schedule, rerun and shrunk.

The operating system decides how the processes interleave, so a chaos schedule does not fail
every time it runs: every figure here is a count of reruns ("failed k of n"), never a claim
that the run reproduces. Within the time budget:

1. the recorded schedule is replayed up to three times (how often it fails as it stands);
2. the schedule with no fault at all is tried (a queue broken without any fault needs
   none), then delta debugging removes faults while a single rerun still fails the same
   way (the first reason's kind);
3. the smallest schedule found is replayed three times, and exported as a pytest file that
   replays it up to three times and fails if any run does.

A run whose every anomaly a weakness the system documents explains (its ``promises``) is
exported as a test that pins that weakness, as a campaign's is (``export``).
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from crashqueuelab.lab.reproducers import rerun
from crashqueuelab.lab.reproducers.campaign import (
    CONFIRMATIONS,
    REPRODUCER_DIRECTORY,
    REPRODUCERS_FILE,
    anomaly_kind,
)
from crashqueuelab.lab.reproducers.ddmin import shrink
from crashqueuelab.lab.reproducers.export import (
    call_text,
    function_name,
    render,
    run_test,
    write_test,
)
from crashqueuelab.lab.runs.commands import runnable
from crashqueuelab.lab.runs.records import write_json

#: What a replay takes from a chaos report besides its schedule.
REPLAYED = ("seed", "crash_mode", "parameters", "system_spec")


def chaos_kind(reason: str) -> str:
    """A chaos reason without its example in parentheses, names or numbers."""
    return anomaly_kind(re.sub(r"\s*\(.*", "", reason))


def replay_record(report: Mapping[str, Any], schedule: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``rerun.replay_chaos`` needs to run ``schedule`` as ``report``'s run ran."""
    record = {key: report[key] for key in REPLAYED if key in report}
    record.setdefault("system_spec", report["system"]["name"])
    return {**record, "schedule": schedule}


def _size(schedule: list[dict[str, Any]], report: Mapping[str, Any]) -> str:
    faults = f"{len(schedule)} fault{'' if len(schedule) == 1 else 's'}"
    return f"{faults} over {report['parameters']['jobs']} jobs"


class _ChaosShrinker:
    def __init__(
        self, run_dir: Path, report: Mapping[str, Any], seconds: float, clock: Callable[[], float]
    ) -> None:
        self.run_dir, self.report, self.clock = run_dir, report, clock
        self.deadline = clock() + seconds
        self.directory = run_dir / REPRODUCER_DIRECTORY
        self.kind = chaos_kind(report["reasons"][0])
        self.runs = 0

    def left(self) -> float:
        return self.deadline - self.clock()

    def run(self, schedule: list[dict[str, Any]], directory: Path) -> bool:
        """One replay of ``schedule``: True when it failed the same way."""
        self.runs += 1
        outcome = rerun.replay_chaos(replay_record(self.report, schedule), directory, attempts=1)
        return any(chaos_kind(line) == self.kind for line in outcome.anomalies)

    def reruns(self, schedule: list[dict[str, Any]], name: str) -> tuple[int, int, list[str]]:
        """Up to CONFIRMATIONS replays while the budget lasts: (failed, ran, directories)."""
        failed, kept = 0, []
        for index in range(CONFIRMATIONS):
            if index and self.left() <= 0:
                break
            directory = self.directory / "reruns" / name / f"rerun-{index + 1}"
            failed += self.run(schedule, directory)
            kept.append(str(directory.relative_to(self.run_dir)))
        return failed, len(kept), kept

    def scratch_run(self, schedule: list[dict[str, Any]]) -> bool:
        directory = self.directory / "search" / str(self.runs)
        try:
            return self.run(schedule, directory)
        finally:
            shutil.rmtree(directory, ignore_errors=True)


def _documented(promises: Mapping[str, Any] | None) -> dict[str, str] | None:
    """The weakness a run's anomalies show when the system documents every one of them (the
    first, where several do); None when a promise was broken."""
    if not promises or not promises["keeps_its_promises"]:
        return None
    shown = promises["weaker_as_documented"]
    return {"what": shown[0]["what"], "source": shown[0]["source"]} if shown else None


def shrink_chaos(
    run_dir: Path,
    report: Mapping[str, Any],
    *,
    seconds: float,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Rerun and shrink the not-ok chaos run in ``run_dir``; write ``reproducer/``; return
    the record (also in ``reproducers.json``)."""
    started = time.perf_counter()
    parameters = report["parameters"]
    if (
        parameters.get("server_restarts")
        or parameters.get("session_kills")
        or parameters.get("failovers")
        or parameters.get("held_commits")
    ):
        refused = {
            "name": "chaos schedule",
            "anomaly": report["reasons"][0],
            "documented": _documented(report.get("promises")),
            "shrunk": False,
            "reason": "a schedule with server faults needs the server the command starts;"
            " rerun it with chaos --replay",
        }
        return {"budget_seconds": seconds, "seconds": 0.0, "reproducers": [refused]}
    shrinker = _ChaosShrinker(run_dir, report, seconds, clock)
    original: list[dict[str, Any]] = list(report["schedule"])
    failed, ran, kept = shrinker.reruns(original, "recorded")
    record: dict[str, Any] = {
        "name": "chaos schedule",
        "anomaly": report["reasons"][0],
        "documented": _documented(report.get("promises")),
        "system": report.get("system_spec", report["system"]["name"]),
        "recorded": {"failed": failed, "reruns": ran, "directories": kept},
        "before": {"operations": report["parameters"]["jobs"], "faults": len(original),
                   "what": _size(original, report)},
    }  # fmt: skip
    smallest, minimal = original, False
    if shrinker.left() > 0 and failed:
        if shrinker.scratch_run([]):
            smallest, minimal = [], True
        else:
            found = shrink(original, shrinker.scratch_run, seconds=shrinker.left(), clock=clock)
            if found is not None:
                smallest, minimal = found.items, found.minimal
    reproduced, confirmations, directories = shrinker.reruns(smallest, "smallest")
    record |= {
        "shrunk": True,
        "after": {"operations": report["parameters"]["jobs"], "faults": len(smallest),
                  "what": _size(smallest, report)},
        "minimal": minimal,
        "runs": shrinker.runs,
        "reproduced": reproduced,
        "confirmations": confirmations,
        "reruns": directories,
        "summary": f"a chaos schedule on {record['system']}",
        "test": function_name("chaos", chaos_kind(record["anomaly"])),
    }  # fmt: skip
    replay = replay_record(report, smallest)
    schedule_path = shrinker.directory / "chaos-schedule.json"
    write_json(schedule_path, replay)
    record["schedule"] = str(schedule_path.relative_to(run_dir))
    record["command"] = runnable(
        f"crashqueuelab chaos --replay {run_dir / directories[0]}"
        f" --output-directory {run_dir / directories[0]}-again",
        report,
    )
    import_path = report.get("system_import_path")
    text = render(
        name=record["test"],
        function="replay_chaos",
        call=call_text("replay_chaos", "RUN", "tmp_path", "attempts=3", "import_path=IMPORT_PATH"),
        record=record,
        import_path=import_path,
        constants={"RUN": {**replay, "system_spec": "SYSTEM"}},
    ).replace('"system_spec": "SYSTEM"', '"system_spec": SYSTEM')
    path = write_test(shrinker.directory, record["test"], text)
    record["test_file"] = str(path.relative_to(run_dir))
    record["test_run"] = run_test(path, import_path=import_path)
    # The file finds its system by itself: the command needs nothing in front of it.
    record["test_command"] = f"python -m pytest {path}"
    record["seconds"] = round(time.perf_counter() - started, 3)
    result = {"budget_seconds": seconds, "seconds": record["seconds"], "reproducers": [record]}
    write_json(shrinker.directory / REPRODUCERS_FILE, result)
    return result


def add_chaos_reproducer(run_dir: Path, report: dict[str, Any], seconds: float) -> None:
    """Shrink a not-ok chaos run and record the result in its ``chaos.json``."""
    report["shrink"] = shrink_chaos(run_dir, report, seconds=seconds)
    write_json(run_dir / "chaos.json", report)
