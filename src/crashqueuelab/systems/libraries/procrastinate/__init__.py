"""procrastinate as a system under test, on the run's PostgreSQL server
(``pip install crashqueuelab[procrastinate]``): its declaration, which the registry reads
without importing procrastinate."""

from crashqueuelab.systems.libraries.skeleton import Library

LIBRARY = Library(
    package=__name__,
    name="procrastinate",
    distribution="procrastinate",
    extra="procrastinate",
    systems=("procrastinate",),
    heartbeats=True,
    server="postgres",
)
