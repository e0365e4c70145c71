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
from crashqueuelab.lab.pages.render import REPORT_FILE, write_report
from tests.conftest import RunCli, invoke_cli

MARKUP = "<script>alert('owned')</script>"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


POWER_LOSS = os.path.exists("/dev/fuse") and sys.platform.startswith("linux")
KINDS = ["showcase", "campaign", "demo", "chaos", "bench", "power-loss", "power-chaos", "mutants"]


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
    return {
        "showcase": showcase,
        "campaign": showcase / "walqueue" / "process-fault-campaign",
        "demo": showcase / "sqlite" / "effect-commit-before-acknowledgement",
        "chaos": base / "chaos",
        "bench": base / "bench",
        "power-loss": showcase / "walqueue" / "power-loss-campaign",
        "power-chaos": base / "power-chaos",
        "mutants": showcase / "mutants",
    }


def needs(kind: str) -> None:
    if kind in ("power-loss", "power-chaos") and not POWER_LOSS:
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
    runs: dict[str, Path], tmp_path: Path
) -> None:
    copy = tmp_path / "campaign"
    shutil.copytree(runs["campaign"], copy)
    report = json.loads((copy / "campaign.json").read_text())
    report["cases"][0]["where"] = MARKUP
    report["anomalies"] = [f"job {MARKUP}: lost"]
    report["ok"] = False
    (copy / "campaign.json").write_text(json.dumps(report))
    history = copy / report["cases"][0]["artifacts"]["history"]
    events = json.loads(history.read_text())
    events.append({"type": "put", "now": 1, "payload": {"body": MARKUP}})
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


def test_a_chaos_page_with_thousands_of_kills_draws_their_density_and_shades_pauses(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    copy = tmp_path / "chaos"
    shutil.copytree(runs["chaos"], copy)
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
    assert 'r="2"' in html  # the lanes' kills drawn small


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
