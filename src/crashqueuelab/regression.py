"""What an exported regression test calls: one failing piece of the lab's evidence, rerun
against a system named as ``package.module:factory`` (or the name of a system the lab
ships, or a pinned release such as ``huey==3.2.1``, rerun in that release's environment).

When the lab says "no", it shrinks the failure and writes a pytest file that calls one of
these with the smallest schedule that still failed (``docs/reproducers.md``). The file fails
while the bug is there and passes once it is gone; a queue author keeps it in their own
suite. A failure the system documents is exported as an expected failure instead
(``Outcome.assert_documented``, ``DocumentedWeakness``). This module is public: its names
and arguments change only with the package's version.
"""

from crashqueuelab.lab.reproducers.rerun import (
    DocumentedWeakness,
    Outcome,
    replay_chaos,
    replay_model_workload,
    run_crash_point,
    run_probe,
)

__all__ = [
    "DocumentedWeakness",
    "Outcome",
    "replay_chaos",
    "replay_model_workload",
    "run_crash_point",
    "run_probe",
]
