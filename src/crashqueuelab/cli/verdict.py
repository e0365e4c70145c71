"""The one line an experiment (or any failed command) ends with on stderr, and the exit
code a verdict gets.

A verdict is one short line: its word, then as many of its details as fit in
``LINE_LIMIT`` characters (the paths it names aside), each detail on one line. What does
not fit is never lost: the line counts the details it leaves out and names the file that
holds them all (the run's record, or the JSON on stdout).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from crashqueuelab.cli.common import EXIT_OK, EXIT_PASSED_WHAT_RAN, EXIT_REJECTED

#: The most characters a verdict line has, besides the paths it names.
LINE_LIMIT = 200
PASSED, PASSED_WHAT_RAN, NOT_OK, INTERRUPTED = "passed", "passed what ran", "not ok", "interrupted"
#: Where the details are when the run kept no record.
_ON_STDOUT = "the JSON on stdout"
_CUT = "..."


def exit_code(ok: bool, passed_what_ran: bool) -> int:
    """0 when everything asked for ran and passed; 5 when what ran passed and some of it
    did not run; 1 when anything that ran failed."""
    if ok:
        return EXIT_OK
    return EXIT_PASSED_WHAT_RAN if passed_what_ran else EXIT_REJECTED


def verdict_word(result: dict[str, Any]) -> str:
    if result.get("interrupted"):
        return INTERRUPTED
    if result.get("ok"):
        return PASSED
    return PASSED_WHAT_RAN if result.get("passed_what_ran") else NOT_OK


def _not_run(result: dict[str, Any]) -> list[str]:
    return [
        # A mutant is a record: its name and why.
        f"not run: {item.get('mutant', '?')}: {item.get('reason', '')}"
        if isinstance(item, dict)
        else f"not run: {item}"
        for item in result.get("not_run") or []
    ]


def details_of(result: dict[str, Any], word: str) -> list[str]:
    """What the verdict says after its word, most important first: the run's headline,
    then what did not run or why it is not ok."""
    details = [str(result["headline"])] if result.get("headline") else []
    if word == PASSED_WHAT_RAN:
        return details or _not_run(result)
    if word == PASSED:
        return details
    error = result.get("error") or {}
    reasons = result.get("reasons") or ([error["message"]] if error.get("message") else [])
    return details + [str(reason) for reason in reasons] or [NOT_OK]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _compose(
    word: str,
    shown: Sequence[str],
    dropped: int,
    cut: bool,
    record: str | None,
    page: str | None,
) -> tuple[str, int]:
    """The line, and its length without the paths it names."""
    line = f"crashqueuelab: {word}" + (f": {'; '.join(shown)}" if shown else "")
    where = record or _ON_STDOUT
    named = len(record) if record else 0
    if cut and dropped:
        line += f" (in full, with {dropped} more, in {where})"
    elif cut:
        line += f" (in full in {where})"
    elif dropped:
        line += f" (and {dropped} more in {where})"
    else:
        named = 0
    if page:
        line += f"; report: {page}"
        named += len(page)
    return line, len(line) - named


def verdict_line(
    result: dict[str, Any], *, record: Path | None = None, experiment: bool = True
) -> str | None:
    """The verdict line of ``result`` (None for a command that is not an experiment and
    passed: its JSON says all). ``record`` is the file that holds every detail."""
    word = verdict_word(result)
    if word == PASSED and not experiment:
        return None
    details = [_one_line(detail) for detail in details_of(result, word)]
    where = str(record) if record is not None else None
    page = str(result["report"]) if result.get("report") else None
    shown: list[str] = []
    for detail in details:
        dropped = len(details) - len(shown) - 1
        _, length = _compose(word, [*shown, detail], dropped, False, where, page)
        if length > LINE_LIMIT:
            break
        shown.append(detail)
    cut = not shown and bool(details)
    if cut:
        # Even the first detail is too long: as much of it as fits, and where the rest is.
        _, length = _compose(word, [_CUT], len(details) - 1, True, where, page)
        shown = [details[0][: LINE_LIMIT - length].rstrip() + _CUT]
    line, _ = _compose(word, shown, len(details) - len(shown), cut, where, page)
    return line
