"""The model-driven workload and the observation judge: correct queues pass under several
seeds; what the callers were told convicts a queue that breaks a lease rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crashqueuelab.judges.observations import judge_observations
from crashqueuelab.lab.workloads.model import OBSERVATIONS_FILE, run_model_workload
from crashqueuelab.systems.registry import resolve_system
from tests.systems.contract.model import reference_system

MUTANTS = "crashqueuelab.lab.mutants.catalog"


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("spec", ["sqlite", "walqueue"])
def test_a_correct_queue_satisfies_every_observation(tmp_path: Path, spec: str, seed: int) -> None:
    report = run_model_workload(resolve_system(spec), tmp_path / "m", seed=seed)
    assert report["ok"], report["anomalies"]
    assert report["observations"] > 300
    assert report["restarts"] > 5
    lines = [
        json.loads(line) for line in (tmp_path / "m" / OBSERVATIONS_FILE).read_text().splitlines()
    ]
    ops = {line["op"] for line in lines}
    assert {"submit", "claim", "ack", "fail", "clock", "recover", "restart"} <= ops
    assert any(line["op"] == "claim" and line["batch"] for line in lines)
    assert any(line["op"] == "ack" and line["verdict"] == "stale" for line in lines)
    if spec == "sqlite":  # every path it declares: chained, and carried by a staged writer
        assert any(line["op"] == "ack" and line.get("chained") for line in lines)
        assert any(line["op"] == "read" and line["attempts"] for line in lines)
        fates = {line["fate"] for line in lines if line["op"] == "carried"}
        assert fates == {"commits", "dies-after-taking", "dies-before-commit", "dies-after-commit"}


def test_the_reference_queue_passes_too(tmp_path: Path) -> None:
    assert run_model_workload(reference_system(), tmp_path / "m", seed=4)["ok"]


@pytest.mark.parametrize(
    ("mutant", "words"),
    [
        ("no_fencing", "of the ended lease"),
        ("claim_takes_leased_jobs", "was live until"),
        ("resubmission_creates_job", "submitted again, the key gave job"),
        ("expiry_without_attempt", "handed out as attempt 2 of 1"),
        ("chained_stale_as_done", "of the ended lease"),
        ("carrier_recovery_trusts_any_event", "of the ended lease"),
    ],
)
def test_a_broken_queue_is_convicted_by_what_its_callers_were_told(
    tmp_path: Path, mutant: str, words: str
) -> None:
    report = run_model_workload(resolve_system(f"{MUTANTS}:{mutant}"), tmp_path / "m", seed=1)
    assert not report["ok"]
    assert any(words in anomaly for anomaly in report["anomalies"]), report["anomalies"][:3]


def write_log(path: Path, *lines: dict[str, object]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + "\n")
    return path


def test_each_rule_of_the_judge(tmp_path: Path) -> None:
    log = write_log(
        tmp_path / "log.jsonl",
        {"op": "submit", "t": 0, "key": "k", "job_id": "j1", "max_attempts": 1},
        {"op": "submit", "t": 1, "key": "k", "job_id": "j2", "max_attempts": 1},
        {"op": "claim", "t": 2, "key": "k", "worker": "a", "token": "t1", "attempt": 1,
         "deadline": 10, "batch": False},
        {"op": "heartbeat", "t": 3, "key": "k", "worker": "a", "token": "t1", "ok": True,
         "deadline": 13},
        {"op": "claim", "t": 12, "key": "k", "worker": "b", "token": "t2", "attempt": 2,
         "deadline": 22, "batch": False},
        {"op": "ack", "t": 14, "key": "k", "worker": "a", "token": "t1", "verdict": "succeeded"},
        {"op": "heartbeat", "t": 15, "key": "k", "worker": "a", "token": "t1", "ok": True,
         "deadline": 25},
        {"op": "ack", "t": 22, "key": "k", "worker": "b", "token": "t2", "verdict": "succeeded"},
        {"op": "claim", "t": 30, "key": "k", "worker": "c", "token": "t3", "attempt": 1,
         "deadline": 40, "batch": True},
        {"op": "fail", "t": 31, "key": "k", "worker": "c", "token": "t9", "verdict": "stale"},
    )  # fmt: skip
    verdict = judge_observations(log, {"k": "pending"})
    texts = "\n".join(verdict.anomalies)
    assert verdict.checked == 10
    assert "submitted again, the key gave job j2; it names j1" in texts
    assert "while a's lease t1 was live until 0.000013 s" in texts
    assert "handed out as attempt 2 of 1" in texts
    assert "an acknowledgement of the ended lease t1 was accepted" in texts
    assert "a heartbeat of the dead lease t1 was accepted" in texts
    assert "at its deadline or later (deadline 0.000022 s) was accepted" in texts
    assert "claimed by c after an accepted acknowledgement" in texts
    assert "an acknowledgement was accepted, but the store shows it pending" in texts


def test_the_judge_compares_what_the_system_reports_with_what_its_callers_were_told(
    tmp_path: Path,
) -> None:
    def attempt(token: str, number: int, deadline: int, outcome: str | None) -> dict[str, object]:
        return {"attempt": number, "worker": "a", "token": token, "deadline": deadline,
                "outcome": outcome}  # fmt: skip

    log = write_log(
        tmp_path / "log.jsonl",
        {"op": "submit", "t": 0, "key": "k", "job_id": "j1", "max_attempts": 3},
        {"op": "claim", "t": 1, "key": "k", "worker": "a", "token": "t1", "attempt": 1,
         "deadline": 100, "batch": False},
        {"op": "heartbeat", "t": 2, "key": "k", "worker": "a", "token": "t1", "ok": True,
         "deadline": 12},
        # As told: the heartbeat's nearer deadline, the attempt still open (or expired).
        {"op": "read", "t": 3, "key": "k", "final": False, "view": None,
         "attempts": [attempt("t1", 1, 12, "expired")]},
        {"op": "fail", "t": 4, "key": "k", "worker": "a", "token": "t1", "verdict": "retry"},
        {"op": "read", "t": 5, "key": "k", "final": False, "view": None,
         "attempts": [attempt("t1", 2, 100, "succeeded"), attempt("t8", 1, 5, None)]},
        {"op": "read", "t": 6, "key": "k", "final": False, "view": None, "attempts": []},
        {"op": "read", "t": 7, "key": "k", "final": True,
         "view": {"status": "leased", "attempts": 1}, "attempts": None},
        {"op": "count", "t": 8, "final": True, "active": 0},
        {"op": "count", "t": 9, "final": False, "active": 5},
    )  # fmt: skip
    texts = "\n".join(judge_observations(log, {"k": "pending"}, {"k": 1}).anomalies)
    assert "reports attempt 2 for lease t1; its holder was told 1" in texts
    assert "reports deadline 100 for lease t1; its holder was told 12" in texts
    assert "reports lease t1 succeeded; its holder was told failed" in texts
    assert "reports an attempt under lease t8, never granted" in texts
    assert "reports no attempt for lease t1, granted" in texts
    assert "reports it leased after 1 attempts; the store holds it pending after 1" in texts
    assert "the system counts 0 unfinished jobs; the store holds 1 (at 0.000008 s)" in texts
    assert texts.count("\n") == 6  # nothing else: the first read and the last count were right
    # Without the store's attempts the final reads are not compared.
    assert "the store holds it" not in "\n".join(
        judge_observations(log, {"k": "pending"}).anomalies
    )
