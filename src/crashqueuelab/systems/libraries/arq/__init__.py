"""arq as a system under test, on a Redis server the run starts (``pip install
crashqueuelab[arq]``): its declaration, which the registry reads without importing arq."""

from crashqueuelab.systems.libraries.skeleton import Library

LIBRARY = Library(
    package=__name__,
    name="arq",
    distribution="arq",
    extra="arq",
    systems=("arq",),
    heartbeats=False,
    server="redis",
    drives="on Redis",
)
