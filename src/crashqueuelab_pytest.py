"""The crashqueuelab pytest plugin, registered through the ``pytest11`` entry point:
``pytest --crashqueuelab-system package.module:factory`` runs the lab's checks on that
system in the user's own suite, beside its own tests; ``pytest crashqueuelab
--crashqueuelab-system ...`` runs them alone (``docs/pytest-plugin.md``).

It sits outside the ``crashqueuelab`` package and imports it only once a session asks for
the checks: pytest loads every installed plugin before measuring coverage starts, and a
package imported that early would leave its import-time lines unmeasured in every project
that installs it. (pytest rewrites the asserts of every module of a distribution that
ships a plugin, so the contract checks' failures say what they compared.)
"""

from __future__ import annotations

import sys

import pytest

OPTION = "--crashqueuelab-system"
#: The contract checks, whose asserts pytest rewrites to say what they compared.
BEHAVIOUR = "crashqueuelab.suite.behaviour"
DEFAULT_SEED = 7


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("crashqueuelab", "the crashqueuelab lab's checks on a system")
    group.addoption(
        OPTION,
        dest="crashqueuelab_system",
        metavar="SPEC",
        help="run the contract checks, the fencing probes, a crash case per crash point and"
        " the model workload on this system (package.module:factory or a shipped name),"
        " beside the session's tests; the argument crashqueuelab runs them alone",
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
def pytest_configure(config: pytest.Config) -> None:
    # First, before any other plugin reads the arguments: the ones that name the lab's
    # checks are no paths, and are taken off before pytest looks for files.
    spec = config.getoption("crashqueuelab_system")
    if not spec:
        return
    if BEHAVIOUR not in sys.modules:
        # An editable install lists none of its modules to pytest, which then rewrites
        # none of their asserts: a failing contract check would not say what it compared.
        pytest.register_assert_rewrite(BEHAVIOUR)
    from crashqueuelab.suite.session import start

    start(
        config,
        spec=spec,
        seed=config.getoption("crashqueuelab_seed"),
        crash_mode=config.getoption("crashqueuelab_crash_mode"),
    )
