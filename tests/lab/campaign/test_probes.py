"""The fencing probes reject a queue for each thing it gets wrong, naming the job."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from crashqueuelab.lab.campaign.probes import PROBES, run_probes
from crashqueuelab.lab.runs.readings import read_store
from crashqueuelab.systems import Claim, JobSpec, OpenRequest, System, Verdict
from tests.systems.contract.model import ReferenceClient, ReferenceState, reference_system


class NewJobEverySubmit(ReferenceClient):
    counter = itertools.count()

    def submit(self, job: JobSpec) -> str:
        return f"{super().submit(job)}-{next(self.counter)}"


class PhantomClaims(ReferenceClient):
    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        claim = super().claim(worker_id, lease_us)
        return claim or Claim("ghost", "twice", "t", {}, 1, worker_id, "ghost")


class NoDeadLetter(ReferenceClient):
    def fail(self, claim: Claim, error: str) -> Verdict:
        verdict = super().fail(claim, error)
        return Verdict.RETRY if verdict is Verdict.DEAD else verdict


class HandsOutLeasedJobs(ReferenceClient):
    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        claim = super().claim(worker_id, lease_us)
        if claim is not None:
            return claim
        leased = [key for key, job in self.state.jobs.items() if job.status.value == "leased"]
        return self.claim_key(leased[0], worker_id, lease_us) if leased else None


class RefusesEveryone(ReferenceClient):
    def succeed(self, claim: Claim) -> Verdict:
        return Verdict.STALE


class TrustsTheLeasesItGranted(ReferenceClient):
    """Judges a batched acknowledgement by the deadline the claim granted, as a queue that
    trusted its memory of the leases it handed out would."""

    def __init__(self, state: ReferenceState, request: OpenRequest) -> None:
        super().__init__(state, request)
        self.granted: dict[str, int] = {}

    def claim_many(self, worker_id: str, lease_us: int, limit: int) -> list[Claim]:
        claims = super().claim_many(worker_id, lease_us, limit)
        self.granted = {claim.key: self.clock.now_us() + lease_us for claim in claims}
        return claims

    def succeed_many(self, claims: Sequence[Claim]) -> list[Verdict]:
        for claim in claims:
            job = self.state.jobs[claim.key]
            if job.token == claim.token and claim.key in self.granted:
                job.deadline = self.granted[claim.key]
        return super().succeed_many(claims)


def verdicts(system: System, tmp_path: Path) -> dict[str, str]:
    return {p["name"]: p["detail"] for p in run_probes(system, tmp_path) if p["ok"] is False}


def test_a_probe_the_lab_cannot_open_the_system_for_did_not_run_and_found_nothing(
    tmp_path: Path,
) -> None:
    """No server named (or any other thing the lab needs and lacks) is a setup error: the
    probe did not run, and that is neither a pass nor a bug of the system. Anything else
    the system raises while opening is its own failure."""
    from crashqueuelab.core.errors import SystemUnavailable

    def unavailable(request: OpenRequest) -> Any:
        raise SystemUnavailable("postgres", "no server: the command line starts one")

    def broken(request: OpenRequest) -> Any:
        raise ValueError("the schema does not parse")

    only = ["idempotent_submit"]
    base = replace(reference_system(), open=unavailable)
    [not_run] = run_probes(base, tmp_path / "a", only=only)
    assert (not_run["status"], not_run["ran"], not_run["ok"]) == ("not run", False, False)
    assert not_run["detail"] == (
        "not run: SystemUnavailable: system 'postgres': no server: the command line starts one"
    )
    [failed] = run_probes(replace(base, open=broken), tmp_path / "b", only=only)
    assert (failed["status"], failed["ran"], failed["ok"]) == ("failed", True, False)
    assert failed["detail"] == "open raised ValueError('the schema does not parse')"


def test_a_probe_the_system_declares_it_cannot_face_does_not_apply(tmp_path: Path) -> None:
    system = reference_system()
    system = replace(system, capabilities=replace(system.capabilities, heartbeats=False))
    results = {p["name"]: p for p in run_probes(system, tmp_path)}
    assert results["heartbeat_after_expiry"] == {
        "name": "heartbeat_after_expiry",
        "ran": False,
        "ok": None,  # neither passed nor failed: it asks nothing of this system
        "status": "not applicable",
        "detail": "not applicable: no heartbeats",
    }
    assert results["idempotent_submit"]["status"] == "passed"


def test_the_reference_passes_every_probe(tmp_path: Path) -> None:
    assert verdicts(reference_system(ReferenceClient), tmp_path) == {}


@pytest.mark.parametrize(
    ("client_class", "probe", "words"),
    [
        (NewJobEverySubmit, "idempotent_submit", "job twice: the same key made two jobs"),
        (PhantomClaims, "idempotent_submit", "a second job was claimable"),
        (NoDeadLetter, "attempts_run_out", "its only attempt answered retry"),
        (HandsOutLeasedJobs, "a_leased_job_is_not_claimed_again", "while worker-a's lease"),
        (RefusesEveryone, "stale_holder_after_expiry", "by the live holder answered stale"),
        (
            TrustsTheLeasesItGranted,
            "batched_acknowledgement_sees_the_lease_as_it_stands",
            "job shortened: a batched acknowledgement after its heartbeat's nearer deadline",
        ),
    ],
)
def test_a_queue_that_gets_one_thing_wrong_fails_that_probe(
    tmp_path: Path, client_class: type[ReferenceClient], probe: str, words: str
) -> None:
    failed = verdicts(reference_system(client_class), tmp_path)
    assert probe in failed
    assert words in failed[probe]


def test_a_system_that_cannot_open_fails_every_probe_that_runs(tmp_path: Path) -> None:
    def refuse(request: OpenRequest) -> Any:
        raise OSError("disk on fire")

    failed = verdicts(replace(reference_system(), open=refuse), tmp_path)
    # The reference system neither chains nor stages carried calls: two probes skip it.
    assert len(PROBES) == 15
    assert len(failed) == len(PROBES) - 2
    assert all("open raised OSError('disk on fire')" in detail for detail in failed.values())


def test_a_reader_that_raises_is_reported_as_a_problem(tmp_path: Path) -> None:
    def broken_reader(directory: Path) -> Any:
        raise ValueError("cannot parse")

    system = replace(reference_system(), reader=broken_reader)
    reading = read_store(system, tmp_path, ["a"])
    assert reading.ok is False
    assert reading.problems == ["the reader raised ValueError: cannot parse"]


def test_the_sqlite_queue_passes_every_probe_on_every_path_it_declares(tmp_path: Path) -> None:
    from crashqueuelab.systems import resolve_system

    results = run_probes(resolve_system("sqlite"), tmp_path)
    assert [result["name"] for result in results if not result["ran"]] == []
    assert [result for result in results if not result["ok"]] == []


@pytest.mark.parametrize(
    ("mutant", "probe", "words"),
    [
        ("heartbeat_in_memory", "heartbeat_survives_restart", "did not reach the store"),
        ("chained_stale_as_done", "chained_acknowledgement_is_fenced", "was accepted"),
        (
            "carrier_recovery_trusts_any_event",
            "carried_calls_are_judged_against_the_store",
            "(carrier dies-after-taking); the store has it LEASED",
        ),
        (
            "attempts_latest_deadline_is_largest",
            "self_reports_match_what_holders_were_told",
            "deadline reported 1006251000, told 1001751000",
        ),
    ],
)
def test_a_planted_bug_on_a_path_only_a_new_probe_drives_fails_it(
    tmp_path: Path, mutant: str, probe: str, words: str
) -> None:
    from crashqueuelab.systems import resolve_system

    system = resolve_system(f"crashqueuelab.lab.mutants.catalog:{mutant}")
    failed = verdicts(system, tmp_path)
    assert probe in failed
    assert words in failed[probe]


class _DueAfterItsInstant(ReferenceClient):
    """A queue that hands a job out only strictly after the instant it was enqueued."""

    enqueued_at = -1

    def submit(self, job: JobSpec) -> str:
        self.enqueued_at = self.clock.now_us()
        return super().submit(job)

    def claim(self, worker_id: str, lease_us: int) -> Claim | None:
        if self.clock.now_us() <= self.enqueued_at:
            return None
        return super().claim(worker_id, lease_us)


def test_every_probe_lets_time_pass_between_a_submission_and_its_claim(tmp_path: Path) -> None:
    results = run_probes(reference_system(_DueAfterItsInstant), tmp_path)
    failed = [(result["name"], result["detail"]) for result in results if result["ok"] is False]
    assert failed == []


@pytest.mark.parametrize(
    ("kept", "status"),
    [
        ({"ran": True, "ok": True}, "passed"),
        ({"ran": True, "ok": False}, "failed"),
        ({"ran": False, "ok": True}, "not applicable"),
        ({"ran": False, "ok": False, "status": "not run"}, "not run"),
    ],
)
def test_a_probe_kept_before_probes_had_a_status_gets_the_one_it_meant(
    kept: dict[str, Any], status: str
) -> None:
    from crashqueuelab.lab.campaign.probes import status_of

    assert status_of(kept) == status
