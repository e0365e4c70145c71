"""taskiq with taskiq-redis's stream broker as a system under test, on a Redis server the run
starts (``pip install crashqueuelab[taskiq]``): its declaration, which the registry reads
without importing taskiq.

The system is named ``taskiq`` and its distribution is ``taskiq-redis``, where the stream
broker and its acknowledgements live: ``--system taskiq==1.0.5`` pins taskiq-redis 1.0.5,
with the newest taskiq that release runs with (the run's version line names both):
releases before 1.2.4 get taskiq below 0.13 (``companions``).
"""

from crashqueuelab.systems.libraries.skeleton import Library

#: The systems, by name: Redis's default persistence (RDB snapshots), and the append-only
#: file synced before each answer, where a power cut should take back nothing answered.
PERSISTENCE_BY_SYSTEM = {"taskiq": "rdb", "taskiq-aof-always": "aof-always"}

LIBRARY = Library(
    package=__name__,
    name="taskiq",
    distribution="taskiq-redis",
    extra="taskiq",
    systems=tuple(PERSISTENCE_BY_SYSTEM),
    heartbeats=False,
    server="redis",
    drives="RedisStreamBroker on Redis",
    # taskiq-redis before 1.2.4 allows taskiq 0.13 (any below 1, or from 0.12.0) but
    # imports taskiq.compat's model_dump, which taskiq 0.13.0 removed.
    companions=(("1.2.4", "taskiq<0.13"),),
)
