"""What the system under test raises is the system's failure, never the lab's.

The lab calls a system in its own process in a few places (opening a store to submit a
run's jobs, the model workload, the effect experiment's cases, the bench's stores). Each
such call runs inside ``calling(system, call)``: whatever it raises becomes
``SystemRaised``, naming the system, the call and the error. The command line keeps the
run's record with ``ok: false`` and that reason, writes its page, and exits 1; a run that
knows what it had finished adds it to ``partial`` on the way, as it does when interrupted.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from crashqueuelab.judges.findings import Anomaly, Kind


class SystemRaised(Exception):
    """The system under test raised from one of its calls."""

    def __init__(self, system: str, call: str, error: BaseException) -> None:
        self.system = system
        self.call = call
        self.error_type = type(error).__name__
        self.error = f"{self.error_type}: {error}"
        self.partial: dict[str, Any] = {}
        super().__init__(self.reason)

    @property
    def reason(self) -> str:
        return f"the system under test ({self.system}) raised from {self.call}: {self.error}"

    def finding(self) -> Anomaly:
        """What a run reports of it: ``system_raised``, naming the call."""
        return Anomaly(
            Kind.SYSTEM_RAISED, self.reason, facts={"call": self.call, "error": self.error_type}
        )

    def to_json(self) -> dict[str, str]:
        return {"system": self.system, "call": self.call, "error": self.error}


@contextmanager
def calling(system: str, call: str) -> Iterator[None]:
    """Run one call of ``system``: what it raises is its failure (``SystemRaised``)."""
    try:
        yield
    except SystemRaised:
        raise
    except Exception as error:
        raise SystemRaised(system, call, error) from error


class NamedCalls:
    """A system's client whose every call says, when it raises, which call it was: what it
    raises becomes ``SystemRaised`` naming the system, the call and the error (a crash
    child's last line then names the call, not only the library's exception)."""

    def __init__(self, system: str, client: Any) -> None:
        self._system = system
        self._client = client

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            with calling(self._system, name):
                return attribute(*args, **kwargs)

        return call
