"""What an exported regression test calls: one failing piece of the lab's evidence, rerun
against a system named as ``package.module:factory`` (or the name of a system the lab
ships).

When the lab says "no", it shrinks the failure and writes a pytest file that calls one of
these with the smallest schedule that still failed (``docs/reproducers.md``). The file fails
while the bug is there and passes once it is gone; a queue author keeps it in their own
suite. This module is public: its names and arguments change only with the package's
version.
"""

from crashqueuelab.lab.reproducers.rerun import (
    Outcome,
    replay_chaos,
    replay_model_workload,
    run_crash_point,
    run_probe,
)

__all__ = ["Outcome", "replay_chaos", "replay_model_workload", "run_crash_point", "run_probe"]
