"""arq as a system under test, on a Redis server the run starts (``pip install
crashqueuelab[arq]``): its declaration, which the registry reads without importing arq."""

from crashqueuelab.systems.libraries.skeleton import Library

#: The systems, by name: Redis's default persistence (RDB snapshots), and the append-only
#: file synced before each answer, where a power cut should take back nothing answered.
PERSISTENCE_BY_SYSTEM = {"arq": "rdb", "arq-aof-always": "aof-always"}

LIBRARY = Library(
    package=__name__,
    name="arq",
    distribution="arq",
    extra="arq",
    systems=tuple(PERSISTENCE_BY_SYSTEM),
    heartbeats=False,
    server="redis",
    drives="on Redis",
)
