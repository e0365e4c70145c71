"""Which of the lab's checks a session runs, from its command-line arguments.

The checks are no files: their node ids start with ``crashqueuelab``
(``crashqueuelab::probe::stale_holder_after_expiry``). An argument that starts so names
them, from any directory; it is taken off pytest's own arguments before pytest looks for
files, so that naming the lab alone collects nothing of the project's tests (nor its
``testpaths``). Without such an argument every check runs, beside whatever pytest
collects of the project as usual.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: The first part of every node id of the lab's checks, and the argument that names them.
ROOT = "crashqueuelab"
#: pytest's separator of the parts of a node id.
SEPARATOR = "::"

Parts = tuple[str, ...]


def node_id(parts: Parts) -> str:
    """The node id of the check at ``parts`` below the root, as pytest prints it."""
    return SEPARATOR.join((ROOT, *parts))


@dataclass(frozen=True)
class Selection:
    """The checks the arguments name, each as its parts below the root (an empty tuple
    names them all); None when no argument names the lab, and every check runs."""

    named: tuple[Parts, ...] | None

    def selects(self, parts: Parts) -> bool:
        return self.named is None or any(parts[: len(named)] == named for named in self.named)

    def unmatched(self, every: Sequence[Parts]) -> list[str]:
        """The node ids the arguments name that are none of ``every`` check, nor a group
        of them."""
        return [
            node_id(named)
            for named in self.named or ()
            if not any(parts[: len(named)] == named for parts in every)
        ]


def split_arguments(arguments: Sequence[str]) -> tuple[Selection, list[str]]:
    """The lab's checks the arguments name, and the arguments left for pytest."""
    named: list[Parts] = []
    rest: list[str] = []
    for argument in arguments:
        root, *parts = argument.split(SEPARATOR)
        if root == ROOT:
            named.append(tuple(parts))
        else:
            rest.append(argument)
    return Selection(tuple(named) if named else None), rest
