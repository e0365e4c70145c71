"""The same evidence over a library's releases: a matrix, or a bisection to the release
where a piece of evidence changes.

Each release runs in its own environment (``lab.environments``) and its own directory,
with its own page; the matrix holds, for each, the lab's verdict, the verdict against the
library's own promises, and the first reason. A bisection runs the first and the last
release of the range, then halves the range between a release that passes and one that
fails until they are neighbours: the second is where the evidence changed. ``at_once``
releases may run side by side (a matrix's releases, a bisection's two ends): each has its
own environment, directory and, unless the evidence names a shared one, server.

The run's verdict follows the releases, never the bisection: ``ok`` only when every release
of the range ran, was judged here and passed the criterion; ``passed_what_ran`` when none
that was judged failed it; the bisection's finding is its own field, and the ``headline``
says in one sentence what each release did.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import InvalidInput, SystemUnavailable
from crashqueuelab.lab.runs.kinds import VERSIONS

VERSIONS_FILE = VERSIONS.record
#: What "passes" means for a bisection: the lab's verdict; the library's own promises; or
#: every crash case of a campaign (the probes and model aside).
CRITERIA = ("ok", "promises", "cases")
#: Runs the evidence on one release into a directory; the run's record.
RunRelease = Callable[[str, Path], dict[str, Any]]
_RELEASE = re.compile(r"^[0-9]+(\.[0-9]+)*$")
#: A run that stopped because what it needs is not here judged nothing of the release; nor
#: did a run after an upgrade whose first run did not make the fault (``NotExercised``).
_UNAVAILABLE = ("SystemUnavailable", "ServerUnavailable", "CrashModeUnavailable", "NotExercised")
#: How a run's reasons say the system raised while it was being opened.
_NOT_OPENED = ("raised from open", "open raised")
#: What a release that passes each criterion does (said of one release, then of several).
_PASSES = {
    "ok": ("passes", "pass"),
    "promises": ("keeps its own promises", "keep their own promises"),
    "cases": ("passes every crash case", "pass every crash case"),
}


def upgrade_directory(directory: Path, upgrade_from: str) -> Path:
    """Where the run of ``upgrade_from`` before a release's (in ``directory``) is kept:
    beside it, named by both."""
    return directory.with_name(f"{upgrade_from}-before-{directory.name}")


def release_key(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.split("."))


def released(distribution: str) -> list[str]:
    """Every final release of ``distribution`` the package index has, oldest first."""
    command = [sys.executable, "-m", "pip", "index", "versions", distribution]
    try:
        found = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        raise SystemUnavailable(distribution, "the package index did not answer") from None
    line = next(
        (row for row in found.stdout.splitlines() if row.startswith("Available versions:")), None
    )
    if found.returncode != 0 or line is None:
        tail = " ".join(found.stderr.strip().splitlines()[-2:])
        raise SystemUnavailable(distribution, f"cannot list its releases: {tail}")
    releases = [part.strip() for part in line.partition(":")[2].split(",")]
    return sorted((r for r in releases if _RELEASE.match(r)), key=release_key)


def choose_releases(text: str, distribution: str) -> list[str]:
    """``A,B,C`` as given (oldest first), or ``A..B``: every release from A to B the index
    has, both included."""
    if ".." in text:
        first, _, last = text.partition("..")
        for end in (first, last):
            if not _RELEASE.match(end):
                raise InvalidInput("releases", f"{end!r} is not a release number such as 3.2.1")
        inside = [
            release
            for release in released(distribution)
            if release_key(first) <= release_key(release) <= release_key(last)
        ]
        if len(inside) < 2:
            raise InvalidInput("releases", f"{text}: the index has {len(inside)} release(s) there")
        return inside
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    bad = [release for release in chosen if not _RELEASE.match(release)]
    if bad or not chosen:
        raise InvalidInput("releases", f"not release numbers: {bad or text!r}")
    if len(set(chosen)) != len(chosen):
        raise InvalidInput("releases", "a release is named twice")
    return sorted(chosen, key=release_key)


def passes(record: dict[str, Any], criterion: str) -> bool:
    if criterion == "promises":
        # A run that judged nothing of its promises (its error stopped it) records None.
        promises = record.get("promises") or {}
        return bool(promises.get("keeps_its_promises", record.get("ok")))
    if criterion == "cases":
        summary = record.get("summary") or {}
        return "failed" in summary and summary["failed"] == 0 and not record.get("error")
    return bool(record.get("ok"))


def not_judged(record: dict[str, Any], reasons: list[str]) -> str | None:
    """Why a release's run judged nothing of it, or None: what the run needs is not here,
    or the release never opened here (every failure is the system raising from open, as
    a release whose schema this server's PostgreSQL cannot run)."""
    error = record.get("error") or {}
    if error.get("type") in _UNAVAILABLE:
        return f"{error['type']}: {error.get('message')}"
    if reasons and all(any(mark in reason for mark in _NOT_OPENED) for reason in reasons):
        return "it never opened here: every failure is the system raising from open"
    return None


def cell(release: str, record: dict[str, Any], criterion: str) -> dict[str, Any]:
    """One release's row of the matrix."""
    reasons = list(record.get("anomalies") or record.get("reasons") or [])
    error = record.get("error")
    if error:
        reasons.insert(0, f"{error.get('type')}: {error.get('message')}")
    promises = record.get("promises") or {}
    broken = list(promises.get("broken_promises") or [])
    if criterion == "promises" and broken and not error:
        # What fails the criterion comes first: a broken promise, not a documented weakness.
        reasons = [broken[0], *(reason for reason in reasons if reason != broken[0])]
    unjudged = not_judged(record, reasons)
    if unjudged is None and criterion == "promises" and error and not record.get("promises"):
        # The run's error stopped it before it judged the release's promises: neither kept
        # nor broken (a worker that failed, a store that could not be read).
        unjudged = f"its promises were not judged: {error.get('type')}: {error.get('message')}"
    return {
        "release": release,
        "ok": bool(record.get("ok")),
        "not_judged": unjudged,
        # Nothing of its promises was seen: neither kept nor broken.
        "keeps_its_promises": None if unjudged else promises.get("keeps_its_promises"),
        "promise_verdict": promises.get("verdict"),
        "weaker_as_documented": [
            entry["what"] for entry in promises.get("weaker_as_documented", [])
        ],
        "broken_promises": len(promises.get("broken_promises", [])),
        "passes": unjudged is None and passes(record, criterion),
        "anomalies": len(reasons),
        "first_reason": reasons[0] if reasons else None,
        "summary": record.get("summary"),
        "version": (record.get("system") or {}).get("version"),
        "report": f"{release}/report.html",
        # The run before it, on the store it then ran on (``versions --upgrade-from``).
        "after": ((record.get("upgrade") or {}).get("from") or {}).get("directory"),
    }


def _said_of(row: dict[str, Any], criterion: str, many: bool) -> str:
    """What the evidence says of a release (``many``: of several with the same result), as
    the rest of a sentence that names it."""
    if row["not_judged"]:
        return "could not be judged here"
    if row["passes"]:
        return _PASSES[criterion][many]
    s, each = ("", " each") if many else ("s", "")
    summary = row.get("summary") or {}
    lost = summary.get("states_losing_acknowledged_work")
    if lost:
        return (
            f"lose{s} acknowledged work at a power cut ({lost} of"
            f" {summary.get('crash_states')} crash states{each})"
        )
    if criterion == "promises":
        return f"break{s} {'their' if many else 'its'} own promises"
    if criterion == "cases" and summary.get("failed"):
        failed, named = summary["failed"], summary.get("named_fault_points")
        return f"fail{s} {failed} of {named} crash points{each}"
    count = row["anomalies"]
    anomalies = f"{count} anomal{'y' if count == 1 else 'ies'}"
    return f"{'are' if many else 'is'} not ok ({anomalies}{each})"


def _named(releases: list[str]) -> str:
    return releases[0] if len(releases) == 1 else f"{', '.join(releases[:-1])} and {releases[-1]}"


def _grouped(rows: list[dict[str, Any]], criterion: str) -> list[str]:
    """Releases with the same result said together, in the order they first appear."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(_said_of(row, criterion, False), []).append(row)
    return [
        f"{_named([row['release'] for row in group])}"
        f" {_said_of(group[0], criterion, len(group) > 1)}"
        for group in groups.values()
    ]


def headline(report: dict[str, Any]) -> str:
    """What was found, in one sentence: what each release that ran did, where the evidence
    changed, and how many releases did not run."""
    rows, criterion, bisection = report["rows"], report["criterion"], report["bisection"]
    found = (bisection or {}).get("found")
    if found is None:
        parts = _grouped(rows, criterion)
        if bisection is not None:
            parts.append("no change between them to find")
    else:
        index = next(i for i, row in enumerate(rows) if row["release"] == found)
        parts = _grouped(rows[:index], criterion)
        parts.append(f"{found} is the first release that {_said_of(rows[index], criterion, False)}")
        after = _grouped(rows[index + 1 :], criterion)
        parts += [f"after it, {part}" for part in after]
    not_run = report["not_run"]
    if not_run:
        # Only a bisection leaves releases of its range out.
        plural = "s" if len(not_run) > 1 else ""
        parts.append(f"{len(not_run)} release{plural} not run (the bisection did not need them)")
    # The releases are the library's: a user's adapter of it runs them, the library is named.
    system = report.get("library") or report.get("system")
    sentence = "; ".join(parts)
    return f"{system} {sentence}" if system else sentence


def judge(report: dict[str, Any]) -> dict[str, Any]:
    """The run's verdict from its releases' rows: ``ok`` only when every release of the
    range ran, was judged and passed; ``passed_what_ran`` when none that was judged failed."""
    judged = [row for row in report["rows"] if not row["not_judged"]]
    failed = [row for row in judged if not row["passes"]]
    complete = not report["not_run"] and len(judged) == len(report["rows"])
    return {
        "ok": not failed and complete,
        "passed_what_ran": not failed,
        "complete": complete,
        "headline": headline(report),
    }


def run_versions(
    releases: Sequence[str],
    run_release: RunRelease,
    output_dir: Path,
    *,
    criterion: str = "ok",
    bisect: bool = False,
    system: str | None = None,
    library: str | None = None,
    at_once: int = 1,
) -> dict[str, Any]:
    """The matrix over ``releases`` (every one, or those a bisection needs), with its
    verdict (``judge``); ``system`` is what ran them (the command's ``--system``),
    ``library`` the library whose releases they are, named in the headline (default:
    ``system``); up to ``at_once`` releases run side by side."""
    if at_once < 1:
        raise InvalidInput("at-once", f"{at_once}: at least one release runs at a time")
    rows: dict[str, dict[str, Any]] = {}

    def run_all(wanted: Sequence[str]) -> None:
        todo = [release for release in wanted if release not in rows]
        for release, record in zip(
            todo, side_by_side(todo, run_release, output_dir, at_once), strict=True
        ):
            rows[release] = cell(release, record, criterion)

    def run(release: str) -> bool:
        run_all([release])
        return bool(rows[release]["passes"])

    bisection: dict[str, Any] | None = None
    if not bisect:
        run_all(releases)
    else:
        low, high = 0, len(releases) - 1
        run_all([releases[low], releases[high]])
        low_passes, high_passes = run(releases[low]), run(releases[high])
        if low_passes == high_passes:
            word = "passes" if low_passes else "fails"
            bisection = {
                "found": None,
                "detail": f"the evidence {word} at both ends ({releases[low]} and"
                f" {releases[high]}): no change to find between them",
            }
        else:
            while high - low > 1:
                middle = (low + high) // 2
                if run(releases[middle]) == low_passes:
                    low = middle
                else:
                    high = middle
            change = "starts passing" if high_passes else "starts failing"
            bisection = {
                "found": releases[high],
                "last_before": releases[low],
                "change": change,
                "detail": f"the evidence {change} at {releases[high]} (after {releases[low]});"
                f" {len(rows)} of {len(releases)} releases run",
            }
    ordered = [rows[release] for release in releases if release in rows]
    report = {
        "releases": list(releases),
        "criterion": criterion,
        "bisect": bisect,
        "bisection": bisection,
        "rows": ordered,
        "not_run": [release for release in releases if release not in rows],
        "system": system,
        "library": library or system,
        "at_once": at_once,
    }
    return report | judge(report)


def side_by_side(
    releases: Sequence[str], run_release: RunRelease, output_dir: Path, at_once: int
) -> list[dict[str, Any]]:
    """Each release's record, in order, with up to ``at_once`` of them running at a time.
    Interrupted (Ctrl-C reaches the runs' processes too, and each stops itself and keeps
    its record), the runs already going are waited for and no other is started."""
    if at_once == 1 or len(releases) < 2:
        return [run_release(release, output_dir / release) for release in releases]
    waiting = list(enumerate(releases))
    running: dict[Future[dict[str, Any]], int] = {}
    records: dict[int, dict[str, Any]] = {}
    pool = ThreadPoolExecutor(max_workers=at_once, thread_name_prefix="release")
    try:
        while waiting or running:
            while waiting and len(running) < at_once:
                index, release = waiting.pop(0)
                running[pool.submit(run_release, release, output_dir / release)] = index
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                records[running.pop(future)] = future.result()
    finally:
        pool.shutdown(wait=True)
    return [records[index] for index in range(len(releases))]
