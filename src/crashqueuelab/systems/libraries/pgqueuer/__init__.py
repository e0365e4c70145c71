"""pgqueuer as a system under test, on the run's PostgreSQL server
(``pip install crashqueuelab[pgqueuer]``): its declaration, which the registry reads
without importing pgqueuer."""

from crashqueuelab.systems.libraries.skeleton import Library

LIBRARY = Library(
    package=__name__,
    name="pgqueuer",
    distribution="pgqueuer",
    extra="pgqueuer",
    systems=("pgqueuer",),
    heartbeats=True,
    server="postgres",
)
