"""What persist-queue documents of itself: none of it recorded as a weakness.

What persist-queue does not have, the adapter does not pretend: there are no leases, no
deadlines and no tokens, and an unacknowledged task comes back only when a process opens
the queue (``auto_resume``), whoever still holds it. The lab measures what follows.
"""

from __future__ import annotations

from crashqueuelab.systems.contract import Documented

#: Nothing: every anomaly the lab finds is reported against the contract.
DOCUMENTED: tuple[Documented, ...] = ()
