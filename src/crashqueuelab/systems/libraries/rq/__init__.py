"""RQ as a system under test, on a Redis server the run starts (``pip install
crashqueuelab[rq]``): its declaration, which the registry reads without importing RQ."""

from crashqueuelab.systems.libraries.skeleton import Library

#: The systems, by name: Redis's default persistence (RDB snapshots) and the three others.
PERSISTENCE_BY_SYSTEM = {
    "rq": "rdb",
    "rq-no-persistence": "none",
    "rq-aof-everysec": "aof-everysec",
    "rq-aof-always": "aof-always",
}

LIBRARY = Library(
    package=__name__,
    name="RQ",
    distribution="rq",
    extra="rq",
    systems=tuple(PERSISTENCE_BY_SYSTEM),
    heartbeats=False,
    server="redis",
    drives="on Redis",
)
