"""huey's ``SqliteHuey`` as a system under test (``pip install crashqueuelab[peers]``): its
declaration, which the registry reads without importing huey."""

from crashqueuelab.systems.libraries.skeleton import Library

LIBRARY = Library(
    package=__name__,
    name="huey",
    distribution="huey",
    extra="peers",
    systems=("huey", "huey-fsync"),
    heartbeats=False,
    drives="SqliteHuey",
)
