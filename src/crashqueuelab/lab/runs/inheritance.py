"""What a run's child process takes over from its parent, explicitly.

The chaos run and the bench start their children from a fork server, which may have been
started before this run (an earlier run in the same process): what the child must see is
handed over with it, never left to whatever the fork server inherited.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from crashqueuelab.lab.runs.servers import SERVER_VARIABLES


@dataclass(frozen=True)
class Inherited:
    #: The parent's import path, so a system given as module:factory imports here too.
    sys_path: tuple[str, ...] = ()
    #: The run's server variables (the DSN of the server the run started or was given).
    environment: tuple[tuple[str, str], ...] = ()

    @classmethod
    def capture(cls) -> Inherited:
        return cls(
            sys_path=tuple(sys.path),
            environment=tuple(
                (name, os.environ[name]) for name in SERVER_VARIABLES if name in os.environ
            ),
        )

    def adopt(self) -> None:
        """Make this process see what its parent saw."""
        sys.path[:0] = [entry for entry in self.sys_path if entry not in sys.path]
        for name in SERVER_VARIABLES:
            os.environ.pop(name, None)
        os.environ.update(dict(self.environment))
