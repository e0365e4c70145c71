"""The step after a campaign says "no": each distinct failure shrunk to the smallest run
that still fails, rerun to confirm it, and exported as a pytest file.

- A failing crash point or probe is rerun alone: the reproducer is that one case (two kills
  at most) or that one race instead of the whole campaign.
- A failing model workload is shrunk by delta debugging over its recorded choices
  (``workloads/choices.py``, ``ddmin.py``): operations are removed while the rerun still fails
  the same way (the first anomaly's kind: its words without names and numbers).

A failure a weakness the system documents explains (``lab.runs.promises``) is no bug: its
reproducer is made the same way, after the bugs' (they come first in the budget and on the
page), and its test pins the documented behaviour (``export``). Failures of one kind share a
reproducer. Everything the lab runs here is deterministic
under the lab (a manual clock, seeded ids), so a reproducer must fail every rerun; the
record says how many of its reruns failed, and the test file is run too. Work stops when
the time budget does: what was not shrunk says so.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from crashqueuelab.judges.findings import Anomaly, restored
from crashqueuelab.lab.campaign.probes import FAILED, status_of
from crashqueuelab.lab.campaign.run import CAMPAIGN_FILE
from crashqueuelab.lab.reproducers import rerun
from crashqueuelab.lab.reproducers.ddmin import shrink
from crashqueuelab.lab.reproducers.export import (
    call_text,
    function_name,
    render,
    run_test,
    write_test,
)
from crashqueuelab.lab.runs.commands import campaign_command
from crashqueuelab.lab.runs.modes import FAILOVER, POWER_LOSS, PROCESS
from crashqueuelab.lab.runs.promises import declared, explained_by
from crashqueuelab.lab.runs.records import write_json
from crashqueuelab.lab.workloads.model import OBSERVATIONS_FILE, SCHEDULE_FILE, run_model_workload
from crashqueuelab.systems.registry import resolve_system

REPRODUCER_DIRECTORY = "reproducer"
REPRODUCERS_FILE = "reproducers.json"
#: The default budget: enough to shrink a model workload of a few hundred operations.
SHRINK_SECONDS = 60.0
#: How many times a reproducer is rerun to confirm it fails.
CONFIRMATIONS = 3
MODEL = "model workload"


def anomaly_kind(text: str) -> str:
    """What an anomaly says, without the names and numbers of the run that found it: two
    runs fail "the same way" when their anomalies share a kind. A line of several reasons
    (a crash case's) is known by its first."""
    text = text.split("; ", maxsplit=1)[0]
    text = re.sub(r"^(case|probe) \S+: ", r"\1: ", text)
    text = re.sub(r"\(at [^)]*\)", "", text)
    text = re.sub(r"\b[0-9a-f]{8,}\b", "#", text)
    text = re.sub(r"\bworker-\w+", "W", text)
    text = re.sub(r"[\w-]*\d[\w./-]*", "#", text)
    return " ".join(text.split())


def _elapsed(started: float) -> float:
    return round(time.perf_counter() - started, 3)


def _count(number: int, thing: str) -> str:
    return f"{number} {thing}{'' if number == 1 else 's'}"


def _campaign_size(report: Mapping[str, Any]) -> dict[str, Any]:
    cases, probes = report["cases"], [p for p in report["probes"] if p["ran"]]
    kills = sum(1 + (case.get("after_crash_at") is not None) for case in cases)
    model = report["model"]
    operations = model.get("steps", 0) if model.get("ran", True) else 0
    what = f"the campaign ({_count(len(cases), 'crash point')}, {_count(len(probes), 'probe')}"
    what += f", a {operations}-operation model workload)" if operations else ")"
    if not cases and not operations:
        what = "the probe" if len(probes) == 1 else f"the {len(probes)} probes"
    return {"operations": operations, "faults": kills, "what": what}


class _Shrinker:
    def __init__(
        self,
        run_dir: Path,
        report: Mapping[str, Any],
        seconds: float,
        correct_system: str | None,
        clock: Callable[[], float],
    ) -> None:
        self.run_dir = run_dir
        self.report = report
        self.spec: str = report.get("system_spec", report["system"]["name"])
        self.clock = clock
        self.deadline = clock() + seconds
        self.seconds = seconds
        self.correct_system = correct_system
        self.directory = run_dir / REPRODUCER_DIRECTORY
        self.records: list[dict[str, Any]] = []
        self.kinds: dict[str, dict[str, Any]] = {}
        self.import_path: str | None = report.get("system_import_path")
        self.weaknesses = declared(report.get("promises"))
        found = restored(report.get("anomalies", []), report.get("findings"))
        #: Each anomaly line's finding, where the campaign kept one.
        self.findings = {item.text: item for item in found if isinstance(item, Anomaly)}

    def documented(self, line: str) -> dict[str, str] | None:
        """The documented weakness that explains the campaign's anomaly ``line``, if any."""
        finding = self.findings.get(line, line)
        index = explained_by(self.weaknesses, finding, self.report["crash_mode"])
        if index is None:
            return None
        weakness = self.weaknesses[index]
        return {"what": weakness.what, "source": weakness.source}

    def left(self) -> float:
        return max(0.0, self.deadline - self.clock())

    def seen(self, anomaly: str, name: str) -> bool:
        """True when a reproducer of this kind exists already (it is named as covering
        ``name`` too)."""
        record = self.kinds.get(anomaly_kind(anomaly))
        if record is None:
            return False
        record.setdefault("also", []).append(name)
        return True

    def out_of_time(self, name: str, anomaly: str, documented: dict[str, str] | None) -> bool:
        if self.left() > 0:
            return False
        self.records.append(
            {
                "name": name,
                "anomaly": anomaly,
                "documented": documented,
                "shrunk": False,
                "reason": f"the shrink budget ({self.seconds:g} s) ran out first",
            }
        )
        return True

    def confirm(
        self, name: str, rerun: Callable[[Path], rerun.Outcome], kind: str
    ) -> tuple[int, list[rerun.Outcome]]:
        outcomes = []
        for index in range(CONFIRMATIONS):
            outcomes.append(rerun(self.reruns(name) / f"rerun-{index + 1}"))
        failed = sum(
            any(anomaly_kind(line) == kind for line in outcome.anomalies) for outcome in outcomes
        )
        return failed, outcomes

    def finish(self, record: dict[str, Any], text: str, started: float) -> None:
        path = write_test(self.directory, record["test"], text)
        record["test_file"] = str(path.relative_to(self.run_dir))
        # Each run is a process of its own that mostly waits: both at once.
        with ThreadPoolExecutor(max_workers=2) as pool:
            exported = pool.submit(run_test, path, import_path=self.import_path)
            correct = self.correct_system and pool.submit(
                run_test, path, import_path=self.import_path, system=self.correct_system
            )
            record["test_run"] = exported.result()
            if correct:
                record["test_run_on_correct_system"] = {
                    "system": self.correct_system,
                    **correct.result(),
                }
        # The file finds its system by itself: the command needs nothing in front of it.
        record["test_command"] = f"python -m pytest {shlex.quote(str(path))}"
        # Shrinking, the reruns that confirm it and the runs of the test file.
        record["seconds"] = _elapsed(started)
        self.records.append(record)
        self.kinds[anomaly_kind(record["anomaly"])] = record

    def reruns(self, record_name: str) -> Path:
        return self.directory / "reruns" / function_name(record_name)

    def record(
        self, name: str, anomaly: str, documented: dict[str, str] | None, **fields: Any
    ) -> dict[str, Any]:
        described = name
        if name == MODEL:  # the model's reproducers are told apart by what they show
            described += " " + re.sub(r"^job #: ", "", anomaly_kind(anomaly))
        return {
            "name": name,
            "anomaly": anomaly,
            "documented": documented,
            "shrunk": True,
            "system": self.spec,
            "test": function_name(described),
            "before": _campaign_size(self.report),
            **fields,
        }

    def single(
        self,
        name: str,
        anomaly: str,
        after: dict[str, Any],
        rerun: Callable[[Path], rerun.Outcome],
        call: tuple[str, str],
        command: str,
    ) -> None:
        started = time.perf_counter()
        kind = anomaly_kind(anomaly)
        reproduced, outcomes = self.confirm(name, rerun, kind)
        record = self.record(
            name,
            anomaly,
            self.documented(anomaly),
            summary=f"{name} on {self.spec}",
            after=after,
            runs=CONFIRMATIONS,
            minimal=True,
            confirmations=CONFIRMATIONS,
            reproduced=reproduced,
            reruns=[str(outcome.directory.relative_to(self.run_dir)) for outcome in outcomes],
            command=command,
        )
        function, expression = call
        text = render(
            name=record["test"],
            function=function,
            call=expression,
            record=record,
            import_path=self.import_path,
        )
        self.finish(record, text, started)

    def case(self, case: Mapping[str, Any], anomaly: str) -> None:
        point, seed, mode = case["fault_point"], self.report["seed"], self.report["crash_mode"]
        bound = self.report.get("crash_states_per_case")
        faults = 1 + (case.get("after_crash_at") is not None)
        what = f"one crash point ({faults} kill{'s' * (faults > 1)}"
        what += ", then the power cut)" if mode == POWER_LOSS else ")"
        self.single(
            f"crash point {point}",
            anomaly,
            {"operations": 0, "faults": faults, "what": what, "case_id": case["case_id"]},
            lambda directory: rerun.run_crash_point(
                self.spec,
                point,
                seed=seed,
                directory=directory,
                crash_mode=mode,
                crash_states=bound,
            ),
            (
                "run_crash_point",
                call_text(
                    "run_crash_point",
                    "SYSTEM",
                    json.dumps(point),
                    f"seed={seed}",
                    "directory=tmp_path",
                    *([f"crash_mode={json.dumps(mode)}"] if mode != PROCESS else []),
                    *([f"crash_states={bound}"] if bound is not None else []),
                    "import_path=IMPORT_PATH",
                ),
            ),
            campaign_command(self.report, str(self.run_dir / "reruns" / point), crash_point=point),
        )

    def probe(self, probe: Mapping[str, Any], anomaly: str) -> None:
        name = probe["name"]
        self.single(
            f"probe {name}",
            anomaly,
            {"operations": 0, "faults": 0, "what": "one probe"},
            lambda directory: rerun.run_probe(self.spec, name, directory),
            (
                "run_probe",
                call_text(
                    "run_probe", "SYSTEM", json.dumps(name), "tmp_path", "import_path=IMPORT_PATH"
                ),
            ),
            campaign_command(self.report, str(self.run_dir / "reruns" / name), probe=name),
        )

    def model(self, anomaly: str) -> None:
        started = time.perf_counter()
        documented = self.documented(f"{MODEL}: {anomaly}")
        model_dir = self.run_dir / "model"
        original = json.loads((model_dir / SCHEDULE_FILE).read_text(encoding="utf-8"))
        kind = anomaly_kind(anomaly)
        system = resolve_system(self.spec)
        scratch = Path(tempfile.mkdtemp(prefix="crashqueuelab-shrink-"))
        counter = iter(range(1 << 30))

        def fails(steps: list[list[int]]) -> bool:
            directory = scratch / str(next(counter))
            schedule = {**original, "choices": [original["choices"][0], *steps]}
            try:
                report = run_model_workload(
                    system, directory, seed=original["seed"], schedule=schedule
                )
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            return any(anomaly_kind(line) == kind for line in report["anomalies"])

        try:
            found = shrink(original["choices"][1:], fails, seconds=self.left(), clock=self.clock)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if found is None:
            self.records.append(
                {"name": MODEL, "anomaly": anomaly, "documented": documented, "shrunk": False,
                 "reason": "rerun from its recorded choices, it did not fail the same way"}
            )  # fmt: skip
            return
        schedule = {**original, "choices": [original["choices"][0], *found.items]}
        schedule["operations"] = len(found.items)
        first = self.reruns(MODEL) / "rerun-1"
        rerun.replay_model_workload(self.spec, schedule, first)
        # The canonical schedule: what the rerun drew, the unused draws left out.
        canonical = json.loads((first / "model" / SCHEDULE_FILE).read_text(encoding="utf-8"))
        shutil.rmtree(first)
        reproduced, outcomes = self.confirm(
            MODEL,
            lambda directory: rerun.replay_model_workload(self.spec, canonical, directory),
            kind,
        )
        shrunk_report = json.loads(
            (outcomes[0].directory / "model.json").read_text(encoding="utf-8")
        )
        faults = shrunk_report["restarts"] + shrunk_report["carrier_deaths"]
        first_anomaly = next(
            line for line in outcomes[0].anomalies if anomaly_kind(line) == kind
        ) if reproduced else anomaly  # fmt: skip
        record = self.record(
            MODEL,
            first_anomaly,
            documented,
            summary=f"the model workload on {self.spec}",
            after={
                "operations": canonical["operations"],
                "faults": faults,
                "what": f"{canonical['operations']} operations ({faults} restarts or carrier"
                " deaths)",
            },
            runs=found.runs,
            minimal=found.minimal,
            confirmations=CONFIRMATIONS,
            reproduced=reproduced,
            reruns=[str(outcome.directory.relative_to(self.run_dir)) for outcome in outcomes],
            chain=str((outcomes[0].directory / OBSERVATIONS_FILE).relative_to(self.run_dir)),
        )
        record["before"] = {
            "operations": original["operations"],
            "faults": self._faults(model_dir),
            "what": f"{original['operations']} operations",
        }
        schedule_path = self.reruns(MODEL) / SCHEDULE_FILE
        write_json(schedule_path, canonical)
        record["schedule"] = str(schedule_path.relative_to(self.run_dir))
        text = render(
            name=record["test"],
            function="replay_model_workload",
            call=call_text(
                "replay_model_workload", "SYSTEM", "SCHEDULE", "tmp_path", "import_path=IMPORT_PATH"
            ),
            record=record,
            import_path=self.import_path,
            constants={"SCHEDULE": canonical},
        )
        record["command"] = None
        self.finish(record, text, started)

    @staticmethod
    def _faults(model_dir: Path) -> int:
        report = json.loads((model_dir / "model.json").read_text(encoding="utf-8"))
        return int(report["restarts"] + report.get("carrier_deaths", 0))


#: The kinds of failure a campaign has, as ``shrink_campaign(only=...)`` names them.
PROBE, CASE = "probe", "case"
FAILURE_KINDS = (PROBE, CASE, MODEL)


def _failures(report: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """Every failure of the campaign as (kind, first anomaly line, its case or probe), in
    the order the campaign ran them."""
    failures: list[tuple[str, str, Mapping[str, Any]]] = [
        (PROBE, f"probe {probe['name']}: {probe['detail']}", probe)
        for probe in report["probes"]
        if status_of(probe) == FAILED
    ]
    lines = report["anomalies"]
    for case in report["cases"]:
        prefix = f"case {case['case_id']}: "
        found = next((line for line in lines if line.startswith(prefix)), None)
        if not case["passed"] and found is not None:
            failures.append((CASE, found, case))
    model = report["model"]
    if not model["ok"] and model.get("ran", True) and model.get("schedule"):
        failures.append((MODEL, model["anomalies"][0], model))
    return failures


def shrink_campaign(
    run_dir: Path,
    report: Mapping[str, Any],
    *,
    seconds: float = SHRINK_SECONDS,
    correct_system: str | None = None,
    only: str | None = None,
    most: int | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Shrink every distinct failure of the campaign in ``run_dir`` (those of the kind
    ``only`` names, at most ``most`` of them); write the reproducers under ``reproducer/``
    with ``reproducers.json``; return that record. ``correct_system`` (where the lab knows
    one, as for its mutants) is run against each exported test, which must pass there."""
    started = time.perf_counter()
    shrinker = _Shrinker(run_dir, report, seconds, correct_system, clock)

    def documented(failure: tuple[str, str, Mapping[str, Any]]) -> dict[str, str] | None:
        kind, anomaly, _ = failure
        return shrinker.documented(f"{MODEL}: {anomaly}" if kind == MODEL else anomaly)

    def bug_first(
        failure: tuple[str, str, Mapping[str, Any]],
    ) -> tuple[str, str, Mapping[str, Any]]:
        """The model workload's failure as its first line no documented weakness explains,
        where one is: its first line may be a weakness, and a bug must not hide behind it."""
        kind, anomaly, source = failure
        if kind != MODEL:
            return failure
        lines = source.get("anomalies") or [anomaly]
        bug = next(
            (line for line in lines if shrinker.documented(f"{MODEL}: {line}") is None), None
        )
        return (kind, anomaly if bug is None else bug, source)

    # The bugs first: they get the budget first, and lead the page.
    failures = [bug_first(failure) for failure in _failures(report)]
    for kind, anomaly, source in sorted(failures, key=lambda f: bool(documented(f))):
        if (only is not None and kind != only) or (
            most is not None and len(shrinker.records) >= most
        ):
            continue
        name = {
            PROBE: f"probe {source.get('name')}",
            CASE: f"crash point {source.get('fault_point')}",
        }.get(kind, MODEL)
        if shrinker.seen(anomaly, name) or shrinker.out_of_time(
            name, anomaly, documented((kind, anomaly, source))
        ):
            continue
        if kind == PROBE:
            shrinker.probe(source, anomaly)
        elif kind == CASE:
            shrinker.case(source, anomaly)
        else:
            shrinker.model(anomaly)
    result = {
        "budget_seconds": seconds,
        "seconds": _elapsed(started),
        "reproducers": shrinker.records,
    }
    if shrinker.records:
        write_json(shrinker.directory / REPRODUCERS_FILE, result)
    return result


def add_reproducers(
    output_dir: Path,
    report: dict[str, Any],
    seconds: float,
    correct_system: str | None = None,
    *,
    only: str | None = None,
    most: int | None = None,
) -> dict[str, Any]:
    """Shrink a not-ok campaign's failures and record the reproducers in its
    ``campaign.json``: ``crashqueuelab shrink DIR`` does this for a retained run."""
    report["shrink"] = shrink_campaign(
        output_dir, report, seconds=seconds, correct_system=correct_system, only=only, most=most
    )
    write_json(output_dir / CAMPAIGN_FILE, report)
    return report


def shrink_if_failed(
    output_dir: Path,
    report: dict[str, Any],
    seconds: float,
    correct_system: str | None = None,
) -> dict[str, Any]:
    """``report`` (a campaign's), with its failures shrunk when it is not ok and
    ``seconds`` allows (0: not at all)."""
    # Evidence that did not run is no failure to shrink; a failover case has no rerun of
    # its own to shrink to (its page gives the command that runs its crash point alone).
    failover = report.get("crash_mode") == FAILOVER
    if not report.get("passed_what_ran", report["ok"]) and seconds > 0 and not failover:
        add_reproducers(output_dir, report, seconds, correct_system)
    return report
