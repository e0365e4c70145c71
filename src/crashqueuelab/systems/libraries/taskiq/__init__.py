"""taskiq with taskiq-redis's stream broker as a system under test, on a Redis server the run
starts (``pip install crashqueuelab[taskiq]``): its declaration, which the registry reads
without importing taskiq.

The system is named ``taskiq`` and its distribution is ``taskiq-redis``, where the stream
broker and its acknowledgements live: ``--system taskiq==1.0.5`` pins taskiq-redis 1.0.5,
with the newest taskiq that release allows (the run's version line names both).
"""

from crashqueuelab.systems.libraries.skeleton import Library

LIBRARY = Library(
    package=__name__,
    name="taskiq",
    distribution="taskiq-redis",
    extra="taskiq",
    systems=("taskiq",),
    heartbeats=False,
    server="redis",
    drives="RedisStreamBroker on Redis",
)
