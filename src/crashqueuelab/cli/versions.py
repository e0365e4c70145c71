"""``crashqueuelab versions``: the same evidence over a library's releases (``lab.versions``)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from crashqueuelab.cli.common import add_with, positive
from crashqueuelab.cli.pages import html_report
from crashqueuelab.cli.pinned import run_pinned
from crashqueuelab.cli.verdict import exit_code
from crashqueuelab.core.errors import InvalidInput
from crashqueuelab.lab.heartbeats.upgrade import UPGRADABLE_LIBRARIES
from crashqueuelab.lab.runs.commands import import_path
from crashqueuelab.lab.runs.kinds import CAMPAIGN, CHAOS, DEPLOYS, DISK_FAULTS, HEARTBEATS
from crashqueuelab.lab.runs.records import prepare_output_directory, write_json
from crashqueuelab.lab.runs.servers import KEPT_REDIS_VARIABLE
from crashqueuelab.lab.versions.environments import Pin, parse_pin, parse_with
from crashqueuelab.lab.versions.matrix import (
    CRITERIA,
    VERSIONS_FILE,
    choose_releases,
    run_versions,
    upgrade_directory,
)
from crashqueuelab.servers.redis import ThrowawayRedis
from crashqueuelab.systems.registry import (
    DISTRIBUTIONS,
    check_claims,
    distribution_of,
    extras_of,
    resolve_system,
)

#: The commands whose evidence a matrix can hold, and the record each writes.
EVIDENCE = {
    kind.command: kind.record for kind in (CAMPAIGN, CHAOS, HEARTBEATS, DEPLOYS, DISK_FAULTS)
}
#: What the printed result keeps of each row (the whole rows are in versions.json).
_ROW_KEYS = ("release", "ok", "not_judged", "keeps_its_promises", "passes", "first_reason")
#: The evidence an upgrade can run: a second run goes on from the first's store.
UPGRADABLE_EVIDENCE = (HEARTBEATS.command,)
#: Options the matrix sets for each release itself.
_SET_BY_THE_MATRIX = ("--system", "--with", "--output-directory")


def _evidence(arguments: list[str]) -> list[str]:
    if arguments and arguments[0] == "--":
        arguments = arguments[1:]
    if not arguments or arguments[0] not in EVIDENCE:
        raise InvalidInput(
            "evidence", f"name the evidence after the options: one of {', '.join(EVIDENCE)}"
        )
    taken = [a for a in arguments if a.split("=")[0] in _SET_BY_THE_MATRIX]
    if taken:
        raise InvalidInput("evidence", f"the matrix sets {', '.join(taken)} for each release")
    return arguments


def _pin_of(args: argparse.Namespace, release: str) -> Pin:
    """The pin one release of the matrix runs: the library's release (or, with ``--vary``,
    the pinned library with that release of the dependency), with ``--with`` beside it."""
    if args.vary is None:
        pin = parse_pin(f"{args.system}=={release}", distribution_of, extras_of)
        fixed = list(args.with_)
    else:
        pin = parse_pin(args.system, distribution_of, extras_of)
        fixed = [*args.with_, f"{args.vary}=={release}"]
    with_fixed = parse_with(fixed, pin)
    assert with_fixed is not None  # a release number, checked by choose_releases
    return with_fixed


def _library(args: argparse.Namespace) -> str | None:
    """What ``--system`` names, its pin checked: ``NAME==VERSION`` only with ``--vary``."""
    name, pinned, _ = args.system.partition("==")
    if args.vary is None and pinned:
        raise InvalidInput(
            "system",
            f"{args.system}: the matrix pins each release itself; to vary a dependency under"
            f" one release, add --vary DIST (as --system {args.system} --vary kombu)",
        )
    if args.vary is not None and not pinned:
        raise InvalidInput(
            "vary",
            f"--vary {args.vary} runs the releases of a dependency under one release of the"
            f" library: pin it, as --system {name}==5.3.1",
        )
    return distribution_of(name)


def _upgrade_from(args: argparse.Namespace, evidence: list[str], distribution: str) -> str | None:
    """``--upgrade-from``'s release, checked: an upgrade runs the heartbeat experiment of a
    library on a Redis server (whose store a later release can be started on), and the
    release is the library's own; an error of one line for anything else."""
    release: str | None = args.upgrade_from
    if release is None:
        return None
    if args.vary is not None:
        raise InvalidInput(
            "upgrade-from", "an upgrade moves the library to a release: not with --vary"
        )
    if evidence[0] not in UPGRADABLE_EVIDENCE:
        raise InvalidInput(
            "upgrade-from",
            f"{evidence[0]} starts each run on a store of its own: an upgrade runs"
            f" {', '.join(UPGRADABLE_EVIDENCE)}, whose second run goes on from the first's store",
        )
    if "--after-run" in (argument.split("=")[0] for argument in evidence):
        raise InvalidInput(
            "upgrade-from", "the upgrade names the run before itself: no --after-run"
        )
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)*", release):
        raise InvalidInput("upgrade-from", f"{release!r} is not a release number such as 1.10.0")
    server = resolve_system(args.system).server
    if server != "redis":
        kept = "keeps its store in files of the run's own" if server is None else f"is on {server}"
        raise InvalidInput(
            "upgrade-from",
            f"{args.system} {kept}: an upgrade starts the next release on the Redis server"
            " and store the first left, which only a system on a Redis server has",
        )
    if distribution not in UPGRADABLE_LIBRARIES:
        raise InvalidInput(
            "upgrade-from",
            f"{args.system}: an upgrade is built for {', '.join(UPGRADABLE_LIBRARIES)} alone"
            " (the second run goes on from its Redis broker's queue, and ends by waiting for"
            " its recovery: dramatiq's maintenance, a heartbeat timeout after its workers"
            " stopped); the other libraries on a Redis server recover on timers of their own"
            " (Celery's visibility timeout is an hour by default)",
        )
    return release


def _versions(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    distribution = _library(args)
    if distribution is None:
        raise InvalidInput(
            "system",
            f"a released library: one of {', '.join(sorted(DISTRIBUTIONS))}, or"
            " package.module:factory whose System names its distribution",
        )
    evidence = _evidence(list(args.evidence))
    # Before any release's environment is made: the evidence's workers may claim.
    check_claims([str(args.system).partition("==")[0]], evidence[0])
    upgrade_from = _upgrade_from(args, evidence, distribution)
    releases = choose_releases(args.releases, args.vary or distribution)
    # Every pin checked before anything runs: a bad --with is one line, nothing started.
    _pin_of(args, releases[0])
    if upgrade_from is not None:
        _pin_of(args, upgrade_from)
    output: Path = args.output_directory
    prepare_output_directory(output)
    err = args.stderr

    def run_one(
        release: str, directory: Path, after: list[str], environment: dict[str, str]
    ) -> dict[str, Any]:
        pin = _pin_of(args, release)
        seed = [] if "--seed" in evidence else ["--seed", str(args.seed)]
        fixed = [
            argument for name, version in pin.also for argument in ("--with", f"{name}=={version}")
        ]
        argv = [
            *evidence,
            *seed,
            *after,
            "--system",
            pin.spec,
            *fixed,
            "--output-directory",
            str(directory),
        ]
        # Side by side, each line a release's run prints says which release it is.
        prefix = f"[{directory.name}] " if args.at_once > 1 else ""
        _, result = run_pinned(pin, argv, err, prefix, environment)
        record_file = directory / EVIDENCE[evidence[0]]
        if record_file.is_file():
            record: dict[str, Any] = json.loads(record_file.read_text())
            return record
        return result

    def run_release(release: str, directory: Path) -> dict[str, Any]:
        print(f"versions {args.system}: {release} ...", file=err, flush=True)
        if upgrade_from is None:
            return run_one(release, directory, [], {})
        return run_upgrade(release, directory)

    def run_upgrade(release: str, directory: Path) -> dict[str, Any]:
        """The evidence on ``upgrade_from``, then on ``release`` on the very server and
        store it left: the second run's record, naming the first."""
        assert upgrade_from is not None
        first = upgrade_directory(directory, upgrade_from)
        persistence = resolve_system(args.system).persistence or "rdb"
        with ThrowawayRedis(persistence) as server:
            server.start()
            kept = {KEPT_REDIS_VARIABLE: str(server.socket)}
            print(
                f"versions {args.system}: {upgrade_from} first, on the server {release} then"
                " runs on ...",
                file=err,
                flush=True,
            )
            before = run_one(upgrade_from, first, [], kept)
            if not (first / EVIDENCE[evidence[0]]).is_file():
                return {
                    "ok": False,
                    "error": {
                        "type": "UpgradeFromFailed",
                        "message": f"the run of {upgrade_from} kept no record: "
                        + str((before.get("error") or {}).get("message")),
                    },
                }
            return run_one(release, directory, ["--after-run", str(first)], kept)

    library = distribution if ":" in args.system else args.system.partition("==")[0]
    if args.vary is not None:
        library = f"{library} {args.system.partition('==')[2]} with {args.vary}"
    report = run_versions(
        releases,
        run_release,
        output,
        criterion=args.bisect_on,
        bisect=args.bisect,
        system=args.system,
        library=library,
        at_once=args.at_once,
    )
    # The seed each release ran with: the evidence's own, where it names one.
    given = evidence[evidence.index("--seed") + 1] if "--seed" in evidence[:-1] else None
    report |= {
        "vary": args.vary,
        "with": list(args.with_),
        "evidence": evidence,
        "seed": args.seed if given is None else given,
        "system_import_path": import_path(args.system),
        "upgrade_from": upgrade_from,
    }
    write_json(output / VERSIONS_FILE, report)
    rows = report["rows"]
    reasons = [
        f"{row['release']}: "
        + (f"not judged: {row['not_judged']}" if row["not_judged"] else str(row["first_reason"]))
        for row in rows
        if not row["passes"]
    ]
    return exit_code(report["ok"], report["passed_what_ran"]), {
        key: report[key]
        for key in ("ok", "passed_what_ran", "complete", "headline", "bisection", "not_run")
    } | {
        "report": html_report(output, err),
        "rows": [{key: row[key] for key in _ROW_KEYS} for row in rows],
        "reasons": reasons,
        "versions_report": str(output / VERSIONS_FILE),
    }


def add_versions_command(command: Any) -> None:
    sub = command(
        "versions",
        _versions,
        "run the same evidence over a library's releases, each in its own environment:"
        " a matrix, or --bisect to the release where the evidence changes",
        database=False,
    )
    sub.add_argument(
        "--system",
        required=True,
        help=f"the library: {', '.join(sorted(DISTRIBUTIONS))}, or package.module:factory"
        " whose System names its distribution",
    )
    add_with(sub)
    sub.add_argument(
        "--vary",
        default=None,
        metavar="DIST",
        help="run the releases of this dependency of the library, under the one release"
        " --system NAME==VERSION pins (as --system celery==5.3.1 --vary kombu --releases"
        " 5.3.1,5.3.2); by default the releases are the library's",
    )
    sub.add_argument(
        "--releases",
        required=True,
        help="A,B,C (those releases) or A..B (every release the package index has from A"
        " to B, both included): the library's, or with --vary the dependency's",
    )
    sub.add_argument(
        "--bisect",
        action="store_true",
        help="run the first and the last, then halve the range to the release where the"
        " evidence starts passing (or failing)",
    )
    sub.add_argument(
        "--bisect-on",
        choices=CRITERIA,
        default="ok",
        help="what passing means: the lab's verdict (ok), the library's own promises"
        " (promises), or every crash case of a campaign (cases); default ok",
    )
    sub.add_argument(
        "--at-once",
        type=positive,
        default=1,
        metavar="N",
        help="run up to N releases side by side (a matrix's releases, a bisection's two"
        " ends); each has its own environment, directory and server unless the evidence"
        " names one (--dsn); default 1",
    )
    sub.add_argument(
        "--upgrade-from",
        default=None,
        metavar="RELEASE",
        help="for each release: run the evidence first on RELEASE, then the release on the"
        " very Redis server and store that run left (heartbeats only, dramatiq only); each"
        " release's row is the second run's, the first's record beside it",
    )
    sub.add_argument(
        "evidence",
        nargs=argparse.REMAINDER,
        help="after the options: the evidence command and its options, for example"
        " campaign --crash-mode power-loss",
    )
