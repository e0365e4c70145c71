"""Finding a system under test by name, or by ``package.module:factory`` import path."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from functools import partial
from importlib.metadata import PackageNotFoundError, version

from crashqueuelab.core.errors import SystemUnavailable, install_hint
from crashqueuelab.systems.contract import System
from crashqueuelab.systems.libraries import (
    arq,
    celery,
    dramatiq,
    huey,
    persistqueue,
    pgqueuer,
    procrastinate,
    rq,
    taskiq,
)
from crashqueuelab.systems.libraries.skeleton import Library


def _sqlite() -> System:
    from crashqueuelab.systems.sqlite import sqlite_system

    return sqlite_system()


def _walqueue() -> System:
    from crashqueuelab.systems.walqueue import walqueue_system

    return walqueue_system()


def _postgres() -> System:
    try:
        from crashqueuelab.systems.postgres import postgres_system
    except ImportError as error:
        raise SystemUnavailable(
            "postgres", f"{error.name} is not installed: {install_hint('postgres')}"
        ) from None
    return postgres_system()


#: The systems shipped with the package, by the name ``--system`` takes.
SHIPPED: dict[str, Callable[[], System]] = {"sqlite": _sqlite, "walqueue": _walqueue}
#: The third-party queues with adapters in the package, as each one's package declares it.
LIBRARIES: tuple[Library, ...] = (
    persistqueue.LIBRARY,
    huey.LIBRARY,
    pgqueuer.LIBRARY,
    procrastinate.LIBRARY,
    rq.LIBRARY,
    arq.LIBRARY,
    celery.LIBRARY,
    dramatiq.LIBRARY,
    taskiq.LIBRARY,
)


def _systems(libraries: Iterable[Library]) -> dict[str, Callable[[], System]]:
    return {name: partial(library.build, name) for library in libraries for name in library.systems}


#: Third-party queues with adapters in the package; their libraries come with the peers extra.
PEERS: dict[str, Callable[[], System]] = _systems(
    library for library in LIBRARIES if library.server is None
)
#: Systems that live on a server the command line provides (a throwaway one, or --dsn).
SERVERS: dict[str, Callable[[], System]] = {
    "postgres": _postgres,
    **_systems(library for library in LIBRARIES if library.server is not None),
}
#: The systems that are released libraries, by the distribution ``--system name==version``
#: installs (``lab.environments``).
DISTRIBUTIONS: dict[str, str] = {
    name: library.distribution for library in LIBRARIES for name in library.systems
}
#: The extras of a library's distribution its systems need in a pinned release's
#: environment (dramatiq's ``redis`` and ``rabbitmq``: its broker clients; Celery's ``redis``:
#: the Redis client its broker transport imports).
PIN_EXTRAS: dict[str, tuple[str, ...]] = {
    library.distribution: library.pin_extras for library in LIBRARIES if library.pin_extras
}
DEFAULT_SYSTEM = "sqlite"


def extras_of(distribution: str) -> tuple[str, ...]:
    return PIN_EXTRAS.get(distribution, ())


def companions_of(name: str, release: str) -> tuple[str, ...]:
    """What a pinned run of the shipped library system ``name`` installs beside ``release``
    (``Library.companions``); nothing for any other system."""
    for library in LIBRARIES:
        if name in library.systems:
            return library.companions_for(release, name)
    return ()


#: What joins a pinned release and each dependency ``--with`` fixes beside it in a run's
#: spec (``celery==5.3.1 with kombu==5.3.1``), as the run records it.
PIN_WITH = " with "


def _installed_release(spec: str, distribution: str, wanted: str) -> None:
    """Refuse ``name==version`` unless that release is the one installed (in the environment
    the command line made for it)."""
    try:
        installed = version(distribution)
    except PackageNotFoundError:
        installed = None
    if installed != wanted:
        here = "nothing" if installed is None else installed
        raise SystemUnavailable(
            spec,
            f"{distribution} {here} is installed here, not {wanted}: the command line"
            " runs a pinned release in an environment of its own",
        )


def distribution_of(name: str) -> str | None:
    """The distribution on the package index that ``--system name==version`` installs: a
    shipped library's, or the one a ``module:factory`` system names (its factory is called
    to read it); None for a system that is no released library."""
    if name in DISTRIBUTIONS:
        return DISTRIBUTIONS[name]
    if name in SHIPPED | PEERS | SERVERS:
        return None
    return resolve_system(name).distribution


def _one_line(error: Exception) -> str:
    """A user's error message on one line: a verdict or a usage error is one line."""
    return " ".join(str(error).split())


def resolve_system(spec: str) -> System:
    """A shipped system by name, or what ``module:factory`` returns when called; either as
    ``name==version`` where that release of its distribution is the one installed."""
    known_systems = SHIPPED | PEERS | SERVERS
    if spec in known_systems:
        return known_systems[spec]()
    if PIN_WITH in spec:
        # A pin with the dependencies fixed beside it (``Pin.label``): each must be the
        # release installed here too.
        pinned_spec, *fixed = spec.split(PIN_WITH)
        for each in fixed:
            dependency, _, release = each.partition("==")
            _installed_release(spec, dependency, release)
        return resolve_system(pinned_spec)
    name, pinned, wanted = spec.partition("==")
    if pinned and name in DISTRIBUTIONS:
        _installed_release(spec, DISTRIBUTIONS[name], wanted)
        return known_systems[name]()
    if pinned:
        system = resolve_system(name)
        if system.distribution is None:
            raise SystemUnavailable(
                spec, "only a released library can be pinned: this system names no distribution"
            )
        _installed_release(spec, system.distribution, wanted)
        return system
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        known = ", ".join(sorted(known_systems))
        raise SystemUnavailable(spec, f"not one of {known}, nor package.module:factory")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise SystemUnavailable(spec, f"cannot import {module_name}: {_one_line(error)}") from None
    except Exception as error:  # a user's module failing as it loads is bad input too
        raise SystemUnavailable(
            spec, f"cannot import {module_name}: {type(error).__name__}: {_one_line(error)}"
        ) from None
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise SystemUnavailable(spec, f"{module_name} has no callable {attribute}")
    try:
        system = factory()
    except Exception as error:  # a user's factory failing is bad input, not a lab crash
        raise SystemUnavailable(
            spec, f"{attribute}() raised {type(error).__name__}: {_one_line(error)}"
        ) from None
    if not isinstance(system, System):
        raise SystemUnavailable(
            spec, f"{attribute}() returned {type(system).__name__}, not a crashqueuelab System"
        )
    return system


#: The commands that run a system's own worker and never claim through its adapter.
OWN_WORKER_COMMANDS = frozenset({"deploys"})


def check_claims(specs: Iterable[str], command: str, label: str | None = None) -> None:
    """Refuse a system whose adapter does not claim (only its library's own worker
    consumes) for a command whose workers claim through the adapter (``label``: how the
    refusal names it, the command in backquotes by default); a spec that does not resolve
    is left to the run, which says why."""
    if command in OWN_WORKER_COMMANDS:
        return
    for spec in specs:
        try:
            system = resolve_system(spec)
        except SystemUnavailable:
            continue
        if not system.capabilities.claims:
            raise SystemUnavailable(
                spec,
                f"only the library's own worker consumes from {system.version}:"
                f" {label or f'`{command}`'} claims through the lab's adapter; run it under"
                " `deploys`",
            )
