"""report.html for every kind of run: built from the retained files, verdict first, every
value from a store shown as text, and (where Chromium is installed) rendered by a real
browser with the verdict visible and the charts drawn."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab import cli
from crashqueuelab.lab.mutants.catalog import MUTANTS
from crashqueuelab.lab.pages.render import REPORT_FILE, write_report
from tests.conftest import EXAMPLES, SHRINK_BUDGET_S, RunCli, invoke_cli
from tests.lab.pages.browser import layout

MARKUP = "<script>alert('owned')</script>"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


POWER_LOSS = os.path.exists("/dev/fuse") and sys.platform.startswith("linux")
KINDS = [
    "showcase", "campaign", "demo", "chaos", "bench", "power-loss", "power-chaos", "mutants",
    "disk-faults",
]  # fmt: skip
#: The kinds only a machine that can cut the power makes.
NEEDS_POWER_LOSS = ("power-loss", "power-chaos", "disk-faults")


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory, showcase_run: tuple[int, Any, Path]
) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("runs")
    showcase = showcase_run[2]
    invoke_cli("chaos", "--seed", "4", "--jobs", "200", "--workers", "2", "--kills", "8",
               "--pauses", "1", "--lease-ms", "300", "--quiet", "--output-directory",
               str(base / "chaos"))  # fmt: skip
    invoke_cli("bench", "--jobs", "20", "--workers", "1,2", "--work-ms", "0", "--quiet",
               "--system", "sqlite", "--system", "walqueue", "--repeat", "2",
               "--output-directory", str(base / "bench"))  # fmt: skip
    if POWER_LOSS:
        invoke_cli("chaos", "--seed", "4", "--jobs", "200", "--workers", "2", "--kills", "4",
                   "--crash-mode", "power-loss", "--power-cuts", "2", "--lease-ms", "300",
                   "--quiet", "--output-directory", str(base / "power-chaos"))  # fmt: skip
        # One fault at one failed fsync per call: a few seconds, every step told failure.
        invoke_cli("disk-faults", "--system", "walqueue", "--disk-fault", "eio-fsync",
                   "--count", "1", "--quiet", "--output-directory",
                   str(base / "disk-faults"))  # fmt: skip
    return {
        "showcase": showcase,
        "campaign": showcase / "walqueue" / "process-fault-campaign",
        "demo": showcase / "sqlite" / "effect-commit-before-acknowledgement",
        "chaos": base / "chaos",
        "bench": base / "bench",
        "power-loss": showcase / "walqueue" / "power-loss-campaign",
        "power-chaos": base / "power-chaos",
        "mutants": showcase / "mutants",
        "disk-faults": base / "disk-faults",
    }


def needs(kind: str) -> None:
    if kind in NEEDS_POWER_LOSS and not POWER_LOSS:
        pytest.skip("power loss needs Linux with /dev/fuse")


def passed(kind: str) -> str:
    """A page's data-ok: without power loss the showcase and its mutants passed only what
    ran, and that is never ok."""
    return "true" if POWER_LOSS or kind not in ("showcase", "mutants") else "false"


@pytest.mark.parametrize("kind", KINDS)
def test_every_run_gets_a_report_with_the_verdict_first(runs: dict[str, Path], kind: str) -> None:
    needs(kind)
    html = (runs[kind] / REPORT_FILE).read_text()
    verdict = html.index('id="verdict"')
    assert verdict < html.index("Key figures")
    assert f'data-ok="{passed(kind)}"' in html[verdict : verdict + 200]
    assert "Passed" in html[verdict : verdict + 400]
    assert "crashqueuelab " in html  # the command that reproduces the run
    assert "<script" not in html  # self-contained, nothing to run
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_the_bench_page_shows_the_batch_sizes_the_batched_path_used(
    runs: dict[str, Path],
) -> None:
    html = (runs["bench"] / REPORT_FILE).read_text()
    cells = json.loads((runs["bench"] / "bench.json").read_text())["cells"]
    batched = [cell for cell in cells if cell["system"] == "sqlite-batched"]
    assert len(batched) == 2
    for cell in batched:
        assert f"{cell['batch_mean']:.1f} ({cell['batch_largest']}), adaptive" in html
    assert "--batch adaptive" in html
    # Two runs of every cell: the median shown, the range of both beside it.
    assert "--repeat 2" in html
    assert html.count(" in 2 runs") == len([cell for cell in cells if "jobs_per_s" in cell])


def test_power_cuts_are_drawn_and_explained(runs: dict[str, Path]) -> None:
    needs("power-chaos")
    html = (runs["power-chaos"] / REPORT_FILE).read_text()
    assert "2 power cuts" in html
    assert html.count("power cut at ") >= 2  # a mark on the chart and a dot per cut at least
    page = (runs["power-loss"] / REPORT_FILE).read_text()
    assert "crash states passed" in page
    assert "keep-names-" in page or "lose-all" in page


def test_the_report_command_rebuilds_a_report_from_the_files_alone(
    runs: dict[str, Path], run_cli: RunCli
) -> None:
    target = runs["chaos"] / REPORT_FILE
    first = target.read_text()
    target.unlink()
    outcome = run_cli("report", str(runs["chaos"]))
    assert outcome.result == {"ok": True, "report": str(target)}
    assert target.read_text() == first


def test_a_directory_without_a_run_is_a_usage_error(tmp_path: Path, run_cli: RunCli) -> None:
    outcome = run_cli("report", str(tmp_path))
    assert outcome.code == cli.EXIT_USAGE
    assert "holds no run" in outcome.result["error"]["message"]
    assert list(tmp_path.iterdir()) == []


def test_everything_from_a_store_or_a_report_is_shown_as_text(
    readable: dict[str, Path], tmp_path: Path
) -> None:
    copy = tmp_path / "campaign"
    shutil.copytree(readable["campaign"], copy)
    report = json.loads((copy / "campaign.json").read_text())
    report["cases"][0]["where"] = MARKUP
    report["anomalies"] = [f"job {MARKUP}: lost"]
    report["ok"] = report["passed_what_ran"] = False
    (copy / "campaign.json").write_text(json.dumps(report))
    history = copy / report["cases"][0]["artifacts"]["history"]
    events = json.loads(history.read_text())
    events.append({"type": "put", "now": 1, "payload": {"body": MARKUP}})
    events.append({"type": "reserve", "now": 2, "lease_seconds": 1, "worker": MARKUP,
                   "task_ids": [f"{report['cases'][0]['case_id']}/{MARKUP}"]})  # fmt: skip
    history.write_text(json.dumps(events))
    html = write_report(copy).read_text()
    assert MARKUP not in html
    assert "&lt;script&gt;alert(&#39;owned&#39;)&lt;/script&gt;" in html
    assert 'data-ok="false"' in html


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (.ci/run installs it)")
@pytest.mark.parametrize("kind", KINDS)
def test_a_real_browser_shows_the_verdict_and_draws_the_charts(
    runs: dict[str, Path], kind: str, tmp_path: Path
) -> None:
    needs(kind)
    assert CHROMIUM is not None
    page = (runs[kind] / REPORT_FILE).resolve().as_uri()
    common = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
              "--enable-logging=stderr", "--v=0", "--window-size=1200,1600"]  # fmt: skip
    dom = subprocess.run([*common, "--dump-dom", page], capture_output=True, text=True,
                         timeout=120, check=True)  # fmt: skip
    assert "CONSOLE" not in dom.stderr
    assert "Uncaught" not in dom.stderr
    verdict = re.search(
        r'<div class="verdict (ok|failed|incomplete)" id="verdict" data-ok="(\w+)"'
        r' data-complete="(\w+)">',
        dom.stdout,
    )
    assert verdict is not None
    assert verdict.group(2) == passed(kind)
    if POWER_LOSS:  # every kind of evidence ran here: nothing is shown as not run
        assert (verdict.group(1), verdict.group(3)) == ("ok", "true")
    for width, height in re.findall(r'<svg [^>]*width="([\d.]+)" height="([\d.]+)"', dom.stdout):
        assert float(width) > 0
        assert float(height) > 0
    shot = tmp_path / f"{kind}.png"
    subprocess.run([*common, f"--screenshot={shot}", page], capture_output=True, timeout=120,
                   check=True)  # fmt: skip
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one


def test_chart_ticks_are_round_values() -> None:
    from crashqueuelab.lab.pages.charts import nice_ticks

    assert nice_ticks(0, 45.4) == [0, 10, 20, 30, 40]
    assert nice_ticks(0, 1384.2) == [0, 500, 1000]
    assert nice_ticks(0, 0.73) == [0, 0.2, 0.4, 0.6]
    assert nice_ticks(3, 3) == [3]


def test_a_lane_chart_gives_labels_their_room_and_counts_a_dense_lane_in_slices() -> None:
    from crashqueuelab.lab.pages.charts import (
        DENSE_LANE,
        DENSE_LANE_COLOR,
        LABEL_ROOM,
        LaneChart,
        label_width,
    )

    kill = {"color": "#d93025", "kind": "SIGKILL", "title": "a kill"}
    reset = {"at": 0.1, "color": "#607d8b", "kind": "connection reset", "title": "a reset"}
    dense = {
        "label": "slot 12 (1,001 processes, 1,000 kills)",
        "spans": [{"start": n / 100, "end": (n + 1) / 100, "color": "#1a73e8", "title": "p"}
                  for n in range(DENSE_LANE + 1)],
        # 200 kills in the first half of the run, three resets among them: the second half's
        # slices hold nothing, and each slice says what it holds.
        "dots": [kill | {"at": n / 400} for n in range(200)] + [reset] * 3,
        "spans_are": "processes, one after another,",
    }  # fmt: skip
    pause = {"start": 0.2, "end": 0.3, "color": "#f29900", "title": "a pause"}
    sparse = {"label": "slot 1", "spans": [], "dots": [kill | {"at": 0.5}], "windows": [pause]}
    chart = LaneChart([dense, sparse], 1.0, [(0.0, "0"), (0.5, "0.50")])
    assert chart.left >= label_width(str(dense["label"])) > LABEL_ROOM
    assert LaneChart([sparse], 1.0).left > LABEL_ROOM  # short labels get the least room
    first, second = chart.lanes()
    [merged] = first["spans"]
    assert merged["color"] == DENSE_LANE_COLOR
    assert merged["title"] == (
        f"{DENSE_LANE + 1} processes, one after another, from 0.00 s to 0.41 s,"
        " too many to draw apart"
    )
    assert first["dots"] == []
    slices = first["slices"]
    plot = 720 - chart.left - 10
    assert 0 < len(slices) <= plot // 12 + 1  # the empty half draws nothing
    counted = [re.findall(r"(\d+) (SIGKILL|connection reset)", s["title"]) for s in slices]
    assert sum(int(n) for found in counted for n, kind in found if kind == "SIGKILL") == 200
    assert [n for found in counted for n, kind in found if kind != "SIGKILL"] == ["3"]
    assert all(s["x"] >= chart.left and 2 <= s["height"] <= 14 for s in slices)
    # The sparse lane beside it: its one kill a dot, its pause a band.
    assert [dot["title"] for dot in second["dots"]] == ["a kill"]
    assert second["slices"] == []
    assert second["windows"][0]["title"] == "a pause"
    assert [x for x, _ in chart.axis()] == [chart.left, round(chart.left + plot / 2, 1)]


def test_a_chaos_page_with_thousands_of_kills_draws_their_density_and_shades_pauses(
    readable: dict[str, Path], tmp_path: Path
) -> None:
    copy = tmp_path / "chaos"
    shutil.copytree(readable["chaos"], copy)
    report = json.loads((copy / "chaos.json").read_text())
    elapsed = report["timings"]["elapsed_s"]
    common = {"pid": 1, "worker_age_s": 0.1, "after_finished": 0, "planned_slot": 0}
    kills = [
        common | {"index": 1000 + n, "kind": "SIGKILL", "worker_slot": n % 2,
                  "at_s": elapsed * n / 200, "worker_id": f"w{n}", "leases_held_at_death": 0}
        for n in range(200)
    ]  # fmt: skip
    pause = common | {
        "index": 999, "kind": "SIGSTOP", "worker_slot": 0, "at_s": elapsed / 4,
        "continued_at_s": elapsed / 2, "worker_id": "wp", "leases_held": 0, "held_leases": [],
        "taken_over": False, "fenced": True, "late_acknowledgements": 0,
    }  # fmt: skip
    shown = [f for f in report["faults"] if f["kind"] not in ("SIGKILL", "SIGSTOP")]
    report["faults"] = shown + kills + [pause]
    (copy / "chaos.json").write_text(json.dumps(report))
    html = write_report(copy).read_text()
    assert "Kills per second (200 in all), the same windows shaded" in html
    assert 'fill-opacity="0.22"' in html  # the pause, shaded on the charts
    assert "shaded: a paused worker, from its SIGSTOP to its SIGCONT" in html
    # A hundred kills in each lane: counted in slices of time, one bar per slice.
    assert "<circle" not in html.split('class="lanes"')[1]
    assert re.search(r"<title>\d+ SIGKILL from [\d.]+ s to [\d.]+ s</title>", html)


@pytest.fixture(scope="module")
def readable(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Runs of every kind whose page a person reads most, made here (not the showcase's):
    walqueue's campaign at the showcase's seed, SQLite's, the unfenced example's failing
    one, a power-loss campaign, the effect demo, two mutants and a small chaos run."""
    base = tmp_path_factory.mktemp("readable")
    made = {
        "campaign": ("campaign", "--system", "walqueue"),
        "sqlite-campaign": ("campaign", "--system", "sqlite"),
        "failing-campaign": ("campaign", "--system", "broken_adapters:stale_ack_system",
                             "--seed", "7", "--shrink-seconds", str(SHRINK_BUDGET_S)),
        "demo": ("demo",),
        "mutants": ("mutants", "--mutant", "no_fencing", "--mutant", "torn_tail_is_corruption",
                    "--named-evidence", "--seeds", "1", "--shrink-seconds", "0"),
        "chaos": ("chaos", "--seed", "4", "--jobs", "200", "--workers", "2", "--kills", "8",
                  "--pauses", "1", "--lease-ms", "300"),
    }  # fmt: skip
    if POWER_LOSS:
        made["power-loss"] = ("campaign", "--system", "walqueue", "--crash-mode", "power-loss")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(EXAMPLES))
        for name, argv in made.items():
            run = invoke_cli(*argv, "--quiet", "--output-directory", base / name)
            assert run.code in (0, 1), run.stderr
    return {name: base / name for name in made}


def test_a_campaign_page_shows_each_case_history_as_folded_transitions(
    readable: dict[str, Path],
) -> None:
    html = (readable["campaign"] / REPORT_FILE).read_text()
    report = json.loads((readable["campaign"] / "campaign.json").read_text())
    assert html.count('<details class="case"') == len(report["cases"])
    assert '<details class="case" id="01-' in html  # the cases table links each one
    assert "<th>from → to</th>" in html
    assert "ready → leased" in html
    assert "leased → completed" in html
    assert "recovery, after the crash" in html
    # No stored row dumped as key=value text: no payloads, no digests, no raw frames.
    for dumped in ("payload=", "tasks=", "lease_seconds=", "'job_type'"):
        assert dumped not in html
    # SQLite's events: leases shortened (the whole token on hover), jobs by their key.
    page = (readable["sqlite-campaign"] / REPORT_FILE).read_text()
    token = re.search(r'<code title="(lease-[0-9a-f]{16})">([0-9a-f]{4,})…</code>', page)
    assert token is not None
    assert token.group(1).removeprefix("lease-").startswith(token.group(2))
    assert "QUEUED → LEASED" in page
    assert '<td title="job-' in page
    assert ">effect</td>" in page


def test_a_failing_case_is_open_and_a_store_without_history_says_so(
    readable: dict[str, Path], tmp_path: Path
) -> None:
    page = (readable["failing-campaign"] / REPORT_FILE).read_text()
    # The example queue keeps no history: one sentence, not a dozen empty tables.
    assert "This system's store keeps no history of its own" in page
    assert '<table class="transitions">' not in page
    copy = tmp_path / "campaign"
    shutil.copytree(readable["campaign"], copy)
    report = json.loads((copy / "campaign.json").read_text())
    report["cases"][1]["passed"] = False
    report["ok"] = False
    (copy / "campaign.json").write_text(json.dumps(report))
    html = write_report(copy).read_text()
    opened = re.findall(r'<details class="case" id="([^"]+)" open>', html)
    assert opened == [report["cases"][1]["case_id"]]


def test_the_mutants_page_names_how_many_mutants_of_which_systems_in_its_header(
    readable: dict[str, Path], tmp_path: Path
) -> None:
    copy = tmp_path / "mutants"
    shutil.copytree(readable["mutants"], copy)
    report = json.loads((copy / "mutants.json").read_text())
    ran = report["mutants"][0]
    # Every mutant of the catalog, as a full run reports them.
    report["mutants"] = [
        ran | {"mutant": m.name, "changes": m.changes, "system": f"{m.original}-mutant-{m.name}"}
        for m in MUTANTS
    ]
    (copy / "mutants.json").write_text(json.dumps(report))
    html = write_report(copy).read_text()
    verdict = html[html.index('id="verdict"') : html.index("</div>", html.index('id="verdict"'))]
    originals = sorted({m.original for m in MUTANTS})  # sqlite and walqueue
    assert f"{len(MUTANTS)} mutants of {', '.join(originals[:-1])} and {originals[-1]}" in verdict
    assert "-mutant-" not in verdict  # the systems' names are in the table, not the header
    for mutant in MUTANTS:
        assert f"{mutant.original}-mutant-{mutant.name}" in html


def dense_chaos(readable: dict[str, Path], tmp_path: Path, kills: int) -> Path:
    """The small chaos run's page redrawn as if slot 0 had taken ``kills`` kills, each
    followed by a new process, in a run of 20,000 jobs."""
    copy = tmp_path / "dense-chaos"
    shutil.copytree(readable["chaos"], copy)
    report = json.loads((copy / "chaos.json").read_text())
    elapsed = report["timings"]["elapsed_s"]
    report["parameters"]["jobs"] = 20_000
    report["faults"] = [f for f in report["faults"] if f["kind"] != "SIGKILL"] + [
        {"index": 1000 + n, "kind": "SIGKILL", "worker_slot": 0, "at_s": elapsed * n / kills,
         "worker_id": f"worker-0.{n + 1}", "pid": 1, "worker_age_s": 0.1, "after_finished": 0,
         "planned_slot": 0, "leases_held_at_death": 0}
        for n in range(kills)
    ]  # fmt: skip
    first = next(w for w in report["workers_started"] if w["slot"] == 0)
    report["workers_started"] = [
        w for w in report["workers_started"] if w["slot"] != 0 or w is first
    ] + [
        {"slot": 0, "started_at_s": elapsed * n / kills + 0.001, "worker_id": f"worker-0.{n + 2}"}
        for n in range(kills)
    ]
    report["kills_delivered"] = kills
    (copy / "chaos.json").write_text(json.dumps(report))
    write_report(copy)
    return copy


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (.ci/run installs it)")
@pytest.mark.parametrize(
    "kind",
    ["campaign", "sqlite-campaign", "failing-campaign", "power-loss", "demo", "mutants", "chaos"],
)
def test_nothing_on_a_page_is_wider_than_its_column(
    readable: dict[str, Path], kind: str, tmp_path: Path
) -> None:
    if kind == "power-loss":
        needs(kind)
    page = (
        (readable[kind] / REPORT_FILE)
        if kind != "chaos"
        else (dense_chaos(readable, tmp_path, 500) / REPORT_FILE)
    )
    measured = layout(page, tmp_path)
    assert measured["column"] > 900
    assert measured["wider"] == []


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (.ci/run installs it)")
def test_the_showcase_sized_campaign_page_is_a_few_screens_tall(
    readable: dict[str, Path], tmp_path: Path
) -> None:
    # walqueue's 24 crash points, the probes and every case's history (folded): before the
    # histories were transitions in folds, the page was about 11,900 px tall.
    measured = layout(readable["campaign"] / REPORT_FILE, tmp_path)
    assert measured["folded"] == 24
    assert measured["height"] < 5_500


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (.ci/run installs it)")
def test_chaos_lanes_stay_readable_at_500_kills_in_a_lane(
    readable: dict[str, Path], tmp_path: Path
) -> None:
    page = dense_chaos(readable, tmp_path, 500) / REPORT_FILE
    html = page.read_text()
    assert "slot 0 (501 processes, 500 kills)" in html
    measured = layout(page, tmp_path)
    [lanes] = measured["lanes"]
    # The 500 kills and 501 processes of slot 0: counted in slices, a bar for each process
    # merged into one, so the chart holds some hundred shapes, not a thousand.
    assert lanes < 300
    others = sum(1 for w in json.loads((page.parent / "chaos.json").read_text())["workers_started"]
                 if w["slot"] == 1)  # fmt: skip
    labels = {label["text"]: label for label in measured["labels"]}
    assert set(labels) == {
        "slot 0 (501 processes, 500 kills)",
        f"slot 1 ({others} processes, 0 kills)",
    }
    for label in labels.values():  # each label whole, left of its lanes
        assert 0 <= label["left"] < label["right"] <= label["room"]


@pytest.mark.parametrize(
    ("section", "word"),
    [
        ({"ok": True, "passed_what_ran": True}, ("passed", "good")),
        ({"ok": False, "passed_what_ran": True}, ("passed what ran", "")),
        ({"ok": False, "passed_what_ran": False}, ("FAILED", "bad")),
    ],
)
def test_a_showcase_section_is_passed_only_when_everything_in_it_ran_and_passed(
    section: dict[str, bool], word: tuple[str, str]
) -> None:
    from crashqueuelab.lab.pages.showcase import _probes, _section_verdict, counts_text

    assert _section_verdict(section) == word
    assert counts_text({"SUCCEEDED": 26, "DEAD": 1}) == "26 SUCCEEDED, 1 DEAD"
    assert counts_text({}) == "none"
    campaign = {"probes_passed": 9, "probes_failed": 1, "probes_not_run": 2}
    assert _probes(campaign) == {"probes": "9 passed, 1 failed, 2 not run", "probes_note": ""}
