"""The crashqueuelab pytest plugin, registered through the ``pytest11`` entry point:
``pytest --crashqueuelab-system package.module:factory`` runs the lab's checks on that
system in the user's own suite (``docs/pytest-plugin.md``).

It sits outside the ``crashqueuelab`` package and imports it only once a session asks for
the checks: pytest loads every installed plugin before measuring coverage starts, and a
package imported that early would leave its import-time lines unmeasured in every project
that installs it. (pytest rewrites the asserts of every module of a distribution that
ships a plugin, so the contract checks' failures say what they compared.)
"""

from __future__ import annotations

import pytest

OPTION = "--crashqueuelab-system"
DEFAULT_SEED = 7


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("crashqueuelab", "the crashqueuelab lab's checks on a system")
    group.addoption(
        OPTION,
        dest="crashqueuelab_system",
        metavar="SPEC",
        help="run the contract checks, the fencing probes, a crash case per crash point and"
        " the model workload on this system: package.module:factory or a shipped name",
    )
    group.addoption(
        "--crashqueuelab-seed",
        dest="crashqueuelab_seed",
        type=int,
        default=DEFAULT_SEED,
        help=f"the seed of the crash cases and the model workload (default {DEFAULT_SEED})",
    )
    group.addoption(
        "--crashqueuelab-crash-mode",
        dest="crashqueuelab_crash_mode",
        default="process",
        metavar="MODE",
        help="how the crash cases crash: process (default) or power-loss (needs /dev/fuse)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    spec = config.getoption("crashqueuelab_system")
    if not spec:
        return
    from crashqueuelab.suite.items import add_checks

    add_checks(
        session,
        items,
        spec=spec,
        seed=config.getoption("crashqueuelab_seed"),
        crash_mode=config.getoption("crashqueuelab_crash_mode"),
    )
