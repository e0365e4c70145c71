"""A crash child whose COMMIT is still in progress on the server when its connection goes.

For an open-commit crash point (``systems.contract.open_commit_phases``) the run's server is
a primary with one synchronous standby (``servers.syncpair``), and the child reaches the
primary through a fault proxy of its own (``lab.network``), as at a reply-lost point. At the
transition's BEFORE phase (inside the transaction, every statement answered) the child
stops the standby's WAL receiver, so the COMMIT is written and flushed on the primary and
then waits for a standby that does not answer. The transaction is still in progress for
every session (``pg_xact_status`` says so) and the server sends no answer.

A watcher on the primary's own socket resets the client's connection in the proxy once it
sees the COMMIT waiting (``SyncRep`` in ``pg_stat_activity``), and lets the standby go on
only once it has seen, in one reading, the COMMIT still waiting and another session of the
same client whose latest statement asks ``pg_xact_status``: the queue asked while the
answer could only be "in progress", and had to wait for the outcome. At the AFTER phase,
which the queue reaches only once it has decided that the transition committed, the child
dies (with other last words, so that the case fails, if the watcher did not see both).
What it saw goes into ``EVIDENCE_FILE`` beside the last words.

Children that share the pair take turns holding its standby (a lock beside it, released
when the child exits): one child's release would otherwise end another's hold.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from crashqueuelab.lab.faults.children import die_with_last_words
from crashqueuelab.lab.faults.network.plan import upstream_of
from crashqueuelab.lab.faults.network.proxy import FaultProxy
from crashqueuelab.lab.faults.network.windows import WindowKind
from crashqueuelab.servers.postgres import DSN_VARIABLE
from crashqueuelab.servers.syncpair import (
    STANDBY_VARIABLE,
    hold_standby,
    release_standby,
    taking_turns,
)
from crashqueuelab.systems.crashpoints import (
    open_commit_phases,
)

#: The longest the standby is held, whatever the watcher saw (the case then fails).
HOLD_LIMIT_S = 5.0
POLL_S = 0.01
EVIDENCE_FILE = "open-commit.json"
_PATH = "crash-child"

#: In one snapshot: the client's sessions waiting for the standby, and the others whose
#: latest statement asks pg_xact_status (the queue's question, asked while the COMMIT waited).
OBSERVED = (
    "SELECT count(*) FILTER (WHERE wait_event = 'SyncRep'),"
    " count(*) FILTER (WHERE wait_event IS DISTINCT FROM 'SyncRep'"
    " AND query LIKE '%%pg_xact_status%%')"
    " FROM pg_stat_activity WHERE application_name = %s"
)


def watch(
    primary_dsn: str, name: str, receiver: int, reset: Callable[[], None], seen: dict[str, Any]
) -> None:
    """Reset the client's connection once its COMMIT is seen waiting for the held standby
    ``receiver``; let the standby go on once the COMMIT was seen still waiting after the
    client asked about it (or after ``HOLD_LIMIT_S``). What it saw goes into ``seen``."""
    import psycopg  # the postgres extra: a child of another system never gets here

    started = time.monotonic()
    readings = 0
    try:
        with psycopg.connect(primary_dsn, autocommit=True, connect_timeout=10) as conn:
            while time.monotonic() - started < HOLD_LIMIT_S:
                row = conn.execute(OBSERVED, (name,)).fetchone()
                readings += 1
                waiting, asked = row if row is not None else (0, 0)
                if waiting and not seen.get("reset_while_waiting"):
                    reset()
                    seen["reset_while_waiting"] = True
                    seen["reset_after_s"] = round(time.monotonic() - started, 3)
                elif waiting and asked:
                    seen["asked_while_open"] = True
                    break
                threading.Event().wait(POLL_S)
    except psycopg.Error as error:
        seen["error"] = f"{type(error).__name__}: {error}".strip()
    finally:
        release_standby(receiver)
        seen["held_s"] = round(time.monotonic() - started, 3)
        seen["readings"] = readings


@contextmanager
def commits_held_open_at(point: str, last_words: str | None) -> Iterator[Callable[[str], None]]:
    """The hook of a child at open-commit ``point``, with the proxy running until the block
    ends (a death at the point ends it with the process)."""
    phases = open_commit_phases(point)
    if phases is None:
        raise ValueError(f"{point} is not an open-commit crash point")
    before, after = phases
    dsn = os.environ.get(DSN_VARIABLE)
    standby = os.environ.get(STANDBY_VARIABLE)
    if not dsn or not standby:
        raise RuntimeError(
            f"{point}: an open-commit point needs a primary with a synchronous standby"
            f" ({DSN_VARIABLE}, {STANDBY_VARIABLE})"
        )
    upstream, through = upstream_of(dsn)
    seen: dict[str, Any] = {}
    watchers: list[threading.Thread] = []
    with ExitStack() as stack:
        proxy = stack.enter_context(FaultProxy(upstream))
        os.environ[DSN_VARIABLE] = through(proxy.add_path(_PATH))
        stack.callback(os.environ.__setitem__, DSN_VARIABLE, dsn)

        def hold() -> None:
            from crashqueuelab.systems.postgres import session_name

            # Taken until this process ends: another holder waits for it.
            stack.enter_context(taking_turns(standby))
            receiver = hold_standby(standby)
            stack.callback(release_standby, receiver)

            def reset() -> None:
                proxy.apply(WindowKind.RESET, [_PATH], 0.0)

            watcher = threading.Thread(
                target=watch,
                args=(dsn, session_name(os.getpid()), receiver, reset, seen),
                daemon=True,
            )
            watchers.append(watcher)
            watcher.start()

        def hook(phase: str) -> None:
            if phase == before and not watchers:
                hold()
            elif phase == after and watchers:
                watchers[0].join(2 * HOLD_LIMIT_S)
                if last_words is not None:
                    evidence = Path(last_words).parent / EVIDENCE_FILE
                    evidence.write_text(json.dumps(seen, sort_keys=True))
                if not seen.get("reset_while_waiting"):
                    words = f"{point}: the connection was not reset while the COMMIT waited"
                elif not seen.get("asked_while_open"):
                    words = f"{point}: the COMMIT was not seen open while the client asked"
                else:
                    words = point
                die_with_last_words(words, last_words)

        yield hook
