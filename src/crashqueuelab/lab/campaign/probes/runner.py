"""The probes in their order, with the capability each needs, and the runner that gives each
one a fresh store and reports its status:

- ``passed`` and ``failed``: it ran (``ok`` true or false);
- ``not applicable``: the system declares it lacks the capability the probe needs, so the
  probe asks nothing of it (``ok`` null: neither passed nor failed, and nothing missing);
- ``not run``: the lab could not open the system for it (``SystemUnavailable``,
  ``ServerUnavailable``: something the run needs is not here). That is a setup error, never
  a finding against the system (``ok`` false, and the reason in ``detail``).

Anything else the system raises, opening included, is the system's own failure."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from crashqueuelab.core.clock import ManualClock
from crashqueuelab.core.errors import (
    CrashModeUnavailable,
    InvalidInput,
    ServerUnavailable,
    SystemUnavailable,
)
from crashqueuelab.core.ids import SeededIds
from crashqueuelab.judges.findings import Anomaly, system_raised
from crashqueuelab.lab.campaign.probes.batches import (
    batched_acknowledgement_fences_each_item,
    batched_acknowledgement_sees_the_lease_as_it_stands,
    chained_acknowledgement_is_fenced,
)
from crashqueuelab.lab.campaign.probes.carried import carried_calls_are_judged_against_the_store
from crashqueuelab.lab.campaign.probes.harness import ProbeFailed, _Bench
from crashqueuelab.lab.campaign.probes.leases import (
    a_leased_job_is_not_claimed_again,
    acknowledgement_at_the_deadline,
    heartbeat_after_expiry,
    heartbeat_survives_restart,
    stale_holder_after_expiry,
    worker_id_reused_after_restart,
)
from crashqueuelab.lab.campaign.probes.lifecycle import (
    attempts_run_out,
    expired_attempts_run_out,
    idempotent_submit,
    retry_delay_is_capped,
)
from crashqueuelab.lab.campaign.probes.reports import self_reports_match_what_holders_were_told
from crashqueuelab.lab.workloads.scenario import RETRY, START_US
from crashqueuelab.systems.contract import OpenRequest, QueueClient, System

Probe = Callable[[_Bench], str]
PASSED, FAILED, NOT_APPLICABLE, NOT_RUN = "passed", "failed", "not applicable", "not run"
#: What the lab needs and may not have here: a probe that meets one did not run.
SETUP_ERRORS = (SystemUnavailable, ServerUnavailable, CrashModeUnavailable)
#: Each probe, and the capability it needs (None: every system).
PROBES: tuple[tuple[str, Probe, str | None], ...] = (
    ("idempotent_submit", idempotent_submit, None),
    ("stale_holder_after_expiry", stale_holder_after_expiry, None),
    ("a_leased_job_is_not_claimed_again", a_leased_job_is_not_claimed_again, None),
    ("worker_id_reused_after_restart", worker_id_reused_after_restart, "fencing_tokens"),
    ("acknowledgement_at_the_deadline", acknowledgement_at_the_deadline, None),
    ("heartbeat_after_expiry", heartbeat_after_expiry, "heartbeats"),
    ("heartbeat_survives_restart", heartbeat_survives_restart, "heartbeats"),
    ("attempts_run_out", attempts_run_out, None),
    ("expired_attempts_run_out", expired_attempts_run_out, None),
    ("retry_delay_is_capped", retry_delay_is_capped, None),
    ("batched_acknowledgement_fences_each_item", batched_acknowledgement_fences_each_item, None),
    (
        "batched_acknowledgement_sees_the_lease_as_it_stands",
        batched_acknowledgement_sees_the_lease_as_it_stands,
        "heartbeats",
    ),
    (
        "self_reports_match_what_holders_were_told",
        self_reports_match_what_holders_were_told,
        "heartbeats",
    ),
    ("chained_acknowledgement_is_fenced", chained_acknowledgement_is_fenced, "chained"),
    (
        "carried_calls_are_judged_against_the_store",
        carried_calls_are_judged_against_the_store,
        "carried",
    ),
)


def run_probe(system: System, directory: Path, name: str, probe: Probe) -> dict[str, Any]:
    clock = ManualClock(START_US)
    opened = [0]

    def opener() -> QueueClient:
        opened[0] += 1
        ids = SeededIds(0, f"probe/{name}/{opened[0]}")
        return system.open(OpenRequest(directory, clock, ids, RETRY))

    try:
        bench = _Bench(opener(), clock, opener)
    except SETUP_ERRORS as error:
        detail = f"not run: {error.kind}: {error}"
        return {"name": name, "ran": False, "ok": False, "status": NOT_RUN, "detail": detail}
    except Exception as error:
        return _failed(name, system_raised(error, f"open raised {error!r}", call="open"))
    try:
        detail = probe(bench)
    except ProbeFailed as failure:
        return _failed(name, failure.finding)
    except Exception as error:  # a system that raises is reported, never a traceback
        return _failed(name, system_raised(error))
    finally:
        bench.client.close()
    return {"name": name, "ran": True, "ok": True, "status": PASSED, "detail": detail}


def _failed(name: str, finding: Anomaly) -> dict[str, Any]:
    """A probe that ran and failed: its detail is the finding's line, kept beside it."""
    return {
        "name": name,
        "ran": True,
        "ok": False,
        "status": FAILED,
        "detail": finding.text,
        "finding": finding.to_json(),
    }


def probe_finding(probe: dict[str, Any]) -> Anomaly | str:
    """A failed probe's line, ``probe NAME: DETAIL``, with its finding (point: the probe's
    name) where its record kept one."""
    line = f"probe {probe['name']}: {probe['detail']}"
    kept = Anomaly.from_json(probe["finding"]) if "finding" in probe else None
    return line if kept is None else kept.within(f"probe {probe['name']}: ", point=probe["name"])


def status_of(probe: dict[str, Any]) -> str:
    """A probe's status, also from a record kept before probes had one (ran and ok)."""
    if "status" in probe:
        return str(probe["status"])
    if not probe["ran"]:
        return NOT_APPLICABLE
    return PASSED if probe["ok"] else FAILED


#: Why a probe that needs a capability skips a system without it.
_LACKS = {
    "fencing_tokens": "no fencing tokens",
    "heartbeats": "no heartbeats",
    "chained": "no chained calls",
    "carried": "no calls another writer's commit can carry",
}


def check_probe_names(names: Sequence[str] | None) -> None:
    """Refuse, before anything runs, a probe name that does not exist."""
    known = [name for name, _, _ in PROBES]
    unknown = sorted(set(names or ()) - set(known))
    if unknown:
        raise InvalidInput(
            "probe", f"{', '.join(unknown)}: no such probe (there are {', '.join(known)})"
        )


def run_probes(
    system: System, directory: Path, only: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """Every probe (or those named in ``only``) on a fresh store below ``directory``; those
    that did not run, or do not apply, say why."""
    check_probe_names(only)
    results = []
    capabilities = system.capabilities.to_json()
    for name, probe, needs in PROBES:
        if only is not None and name not in only:
            continue
        if needs is not None and not capabilities[needs]:
            results.append(
                {
                    "name": name,
                    "ran": False,
                    "ok": None,
                    "status": NOT_APPLICABLE,
                    "detail": f"not applicable: {_LACKS[needs]}",
                }
            )
            continue
        results.append(run_probe(system, directory / name, name, probe))
    return results
