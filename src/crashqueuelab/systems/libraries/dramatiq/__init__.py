"""dramatiq as a system under test, with its Redis broker on a Redis server the run starts
(``pip install crashqueuelab[dramatiq]``): its declaration, which the registry reads without
importing dramatiq."""

from crashqueuelab.systems.libraries.skeleton import Library

LIBRARY = Library(
    package=__name__,
    name="dramatiq",
    distribution="dramatiq",
    extra="dramatiq",
    systems=("dramatiq",),
    heartbeats=False,
    server="redis",
    drives="its Redis broker",
)
