"""dramatiq as a system under test, with its Redis broker on a Redis server the run starts
(``pip install crashqueuelab[dramatiq]``): its declaration, which the registry reads without
importing dramatiq."""

from crashqueuelab.systems.libraries.skeleton import Library

#: Its systems on its Redis broker, by name: Redis's default persistence (RDB snapshots), and
#: the append-only file synced before each answer, where a power cut should take back
#: nothing answered.
PERSISTENCE_BY_SYSTEM = {"dramatiq": "rdb", "dramatiq-aof-always": "aof-always"}

LIBRARY = Library(
    package=__name__,
    name="dramatiq",
    distribution="dramatiq",
    extra="dramatiq",
    # On its Redis broker; and on its RabbitMQ broker (a node the run starts, the results in
    # Redis).
    systems=(*PERSISTENCE_BY_SYSTEM, "dramatiq-rabbitmq"),
    heartbeats=False,
    server="redis",
    drives="its Redis broker",
    # dramatiq leaves redis-py and pika to its extras; each release pins the redis-py it
    # takes (1.10.0 to 1.12.0: < 4; 1.12.1: < 5; 1.17: < 6; 2.x: < 9).
    pin_extras=("redis", "rabbitmq"),
)
