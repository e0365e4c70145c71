"""The page of a power-cut run: what the broker promised of a confirm, what was sent to each
queue, the cut (what was left unsynced), and each crash state: what the node started on it
listed per queue against what that queue confirmed."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from crashqueuelab.lab.pages.common import Verdict, View, read_json
from crashqueuelab.lab.runs.kinds import POWER_CUT

#: A crash state's fates of the operations pending at the cut, as the page names them.
_FATES = ("kept", "lost", "zeroed")


def _command(record: dict[str, Any], run_dir: Path) -> str:
    parameters = record["parameters"]
    publisher = parameters.get("publisher", "pika")
    return (
        f"crashqueuelab power-cut --server {parameters['server']}"
        + (f" --publisher {publisher}" if publisher != "pika" else "")
        + f" --confirmed {parameters['confirmed']} --unconfirmed {parameters['unconfirmed']}"
        f" --states {parameters['states']} --seed {record['seed']}"
        f" --output-directory {shlex.quote(str(run_dir))}"
    )


def _queue_cell(judged: dict[str, Any], sent: dict[str, int]) -> dict[str, Any]:
    found = judged["found"]
    text = f"{found} listed, {sent['confirmed']} confirmed"
    if found is not None and sent["unconfirmed"]:
        text += f"; {judged['unconfirmed_kept']} of {sent['unconfirmed']} unconfirmed kept"
    return {
        "text": "the queue is gone" if found is None else text,
        "passed": judged["passed"],
        "why": judged.get("why", ""),
    }


def _state(state: dict[str, Any], sent: dict[str, dict[str, int]]) -> dict[str, Any]:
    row: dict[str, Any] = {
        "choice": state["choice"],
        "pending": state["pending"],
        "fates": ", ".join(f"{state[fate]} {fate}" for fate in _FATES if state.get(fate)),
        "passed": state["passed"],
        "seconds": state.get("seconds"),
        "queues": {},
        "problem": state.get("refused") or state.get("unread") or "",
    }
    if "queues" in state:
        row["queues"] = {
            name: _queue_cell(judged, sent[name]) for name, judged in state["queues"].items()
        }
    return row


def power_cut_view(run_dir: Path) -> View:
    record = read_json(run_dir / POWER_CUT.record)
    node = record["node"]
    cut = record["power_cut"]
    verdict = Verdict(
        ok=record["ok"],
        title=f"power cut: one {node['server']} node, {len(record['queues'])} durable queues",
        system=f"{node['server']} {node['version']}",
        durability="durable queues; published by "
        + record.get("publisher", {}).get("words", "pika, with publisher confirms"),
        seed=record["seed"],
        duration=record["timings"]["wall_s"],
        command=_command(record, run_dir),
        reasons=record["reasons"],
        system_heading="server",
    )
    figures = [
        (
            f"{name} queue",
            f"{counts['states_kept_every_confirmed']} of {cut['crash_states']} states kept"
            f" all {counts['confirmed']}",
            f"{counts['states_losing_confirmed']} lost confirmed messages;"
            f" {counts['unconfirmed']} more published without confirms",
        )
        for name, counts in record["verdict"].items()
    ]
    figures += [
        (
            "crash states",
            f"{cut['crash_states']} started of {cut['choices']} choices",
            f"{len(cut['left_unstarted'])} left unstarted, {cut['duplicates_skipped']} the same"
            " as one started",
        ),
        (
            "left unsynced at the cut",
            f"{cut['pending_writes']} writes, {cut['pending_directory_changes']} names",
            f"the broker made {cut['file_syncs']} file syncs and {cut['directory_syncs']}"
            " directory syncs before the cut",
        ),
        ("refused to start", str(record["refused"]), "a node started on a crash state"),
        ("could not be read", str(record["unread"]), "rabbitmqctl list_queues"),
        (
            "wall time",
            f"{record['timings']['wall_s']:g} s",
            f"{record['timings']['cut_s']:g} s to the cut",
        ),
    ]
    data = {
        "headline": record["headline"],
        "question": record["question"],
        "promise": record["promise"],
        "queues": record["queues"],
        "sent": record["sent"],
        "publisher": record.get("publisher", {}).get("words", "pika, with publisher confirms"),
        "states": [_state(state, record["sent"]) for state in record["crash_states"]],
        "unstarted": cut["left_unstarted"],
    }
    return View("powercut.html.j2", verdict, figures, data)
