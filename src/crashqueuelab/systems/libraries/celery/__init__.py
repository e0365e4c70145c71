"""Celery as a system under test, on its Redis broker, on a Redis server the run starts
(``pip install crashqueuelab[celery]``): its declaration, which the registry reads without
importing Celery."""

from crashqueuelab.systems.libraries.skeleton import Library

LIBRARY = Library(
    package=__name__,
    name="Celery",
    distribution="celery",
    extra="celery",
    # At Celery's defaults (early acknowledgement), and at its documented reliable
    # configuration (task_acks_late, task_reject_on_worker_lost, a stated visibility_timeout);
    # its own worker with the prefork pool, the solo pool (celery-solo), or the gevent pool
    # at the reliable configuration (celery-gevent-acks-late).
    # The same two settings on its RabbitMQ broker (celery-rabbitmq, celery-rabbitmq-acks-late:
    # a node the run starts, the results in Redis).
    systems=(
        "celery",
        "celery-acks-late",
        "celery-solo",
        "celery-gevent-acks-late",
        "celery-rabbitmq",
        "celery-rabbitmq-acks-late",
    ),
    heartbeats=False,
    server="redis",
    drives="on its Redis broker",
    # kombu's Redis transport imports redis-py, which only this extra installs.
    pin_extras=("redis",),
    # What Celery's own gevent extra requires (the same in 5.4.0 and 5.5.0), beside the
    # release of the one system whose worker runs that pool.
    system_companions=(("celery-gevent-acks-late", "gevent>=1.5.0"),),
)
