"""Findings: one record of what the lab found beside the line it prints, kept in every record
file and read back from it, also from a record kept before findings existed."""

from __future__ import annotations

import re

from crashqueuelab.judges.findings import (
    Anomaly,
    Kind,
    inconsistent,
    joined,
    restored,
    system_raised,
    texts,
    to_json,
)
from tests.conftest import ROOT

BEYOND = Anomaly(
    Kind.ATTEMPT_BEYOND_LIMIT,
    "job k: handed out as attempt 2 of 1 (at 1 s)",
    job="k",
    attempt=2,
    limit=1,
    facts={"previous_attempt": "expired"},
)


def test_a_finding_is_kept_as_json_and_read_back_the_same() -> None:
    kept = BEYOND.to_json()
    assert kept["kind"] == "attempt_beyond_limit"
    assert "parts" not in kept
    assert Anomaly.from_json(kept) == BEYOND
    # Fields and facts by the names a condition uses.
    assert (BEYOND.value("attempt"), BEYOND.value("previous_attempt")) == (2, "expired")
    assert BEYOND.value("point") is None
    assert BEYOND.value("nothing") is None


def test_a_line_names_where_it_was_found_and_joins_reasons_as_parts() -> None:
    lost = Anomaly(Kind.LOST_IN_RECOVERY, "job a: missing after recovery", job="a")
    effects = Anomaly(Kind.EFFECTS_NOT_ONCE, "effects after recovery: {}")
    line = joined("case 01-x: ", [lost, effects]).within("", point="x:after", case="01-x")
    assert line.text == "case 01-x: job a: missing after recovery; effects after recovery: {}"
    assert (line.kind, line.job, line.point) == (Kind.LOST_IN_RECOVERY, "a", "x:after")
    assert [part.kind for part in line.leaves()] == [Kind.LOST_IN_RECOVERY, Kind.EFFECTS_NOT_ONCE]
    # The place's point and facts reach every part, each keeping its own words.
    assert {(part.point, part.facts["case"]) for part in line.parts} == {("x:after", "01-x")}
    assert line.parts[1].text == "effects after recovery: {}"
    assert Anomaly.from_json(line.to_json()) == line
    assert BEYOND.leaves() == (BEYOND,)


def test_a_record_without_findings_or_with_an_unknown_kind_reads_as_its_lines() -> None:
    lines = [BEYOND.text, "job b: something a later lab found"]
    later = {**BEYOND.to_json(), "kind": "found_by_a_later_lab", "text": lines[1]}
    assert restored(lines, None) == lines
    assert restored(lines, [BEYOND.to_json(), later]) == [BEYOND, lines[1]]
    # A line joining reasons, one of an unknown kind, reads as its line alone.
    mixed = {**BEYOND.to_json(), "text": "case 01: x", "parts": [later]}
    assert Anomaly.from_json(mixed) is None
    assert texts([BEYOND]) == [BEYOND.text]
    assert to_json([BEYOND]) == [BEYOND.to_json()]


def test_what_a_system_raised_and_what_its_reader_found_are_findings() -> None:
    raised = system_raised(ValueError("no"), call="open")
    assert (raised.kind, raised.text) == (Kind.SYSTEM_RAISED, "the system raised ValueError: no")
    assert dict(raised.facts) == {"error": "ValueError", "call": "open"}
    found = inconsistent("two leases", "judge: ")
    assert (found.kind, found.text, found.facts["problem"]) == (
        Kind.STORE_INCONSISTENT,
        "judge: two leases",
        "two leases",
    )


def test_docs_list_every_kind_of_finding() -> None:
    text = (ROOT / "docs" / "systems.md").read_text()
    start = text.index("### What the lab finds")
    section = text[start : text.index("\n## ", start)]
    listed = set(re.findall(r"^\| `([a-z_]+)`(?:, `([a-z_]+)`)?(?:, `([a-z_]+)`)?", section, re.M))
    names = {name for row in listed for name in row if name}
    assert names == {kind.value for kind in Kind}
