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
    # its own worker with the prefork pool, or the solo pool (celery-solo).
    systems=("celery", "celery-acks-late", "celery-solo"),
    heartbeats=False,
    server="redis",
    drives="on its Redis broker",
    # kombu's Redis transport imports redis-py, which only this extra installs.
    pin_extras=("redis",),
)
