"""A user's adapters, imported where pytest is not installed (a release's environment)."""

from __future__ import annotations

import dataclasses

from crashqueuelab.systems import System, resolve_system


def my_huey() -> System:
    """A user's adapter of huey: the shipped one under another name."""
    return dataclasses.replace(resolve_system("huey"), name="my-huey")


def unreleased() -> System:
    """A user's queue that is no released library."""
    return resolve_system("sqlite")
