"""persist-queue's ``SQLiteAckQueue`` as a system under test (``pip install
crashqueuelab[peers]``): its declaration, which the registry reads without importing
persist-queue."""

from crashqueuelab.systems.libraries.skeleton import Library

LIBRARY = Library(
    package=__name__,
    name="persist-queue",
    distribution="persist-queue",
    extra="peers",
    systems=("persist-queue",),
    heartbeats=False,
    drives="SQLiteAckQueue",
)
