"""Whether a crash mode can be had: an unknown mode, a machine without FUSE, an experiment
that cannot put the system's data on the power-loss disk, or a failover of a system with no
PostgreSQL server is refused."""

from __future__ import annotations

from crashqueuelab.core.errors import CrashModeUnavailable, InvalidInput
from crashqueuelab.lab.faults.powerloss.disk import require_power_loss
from crashqueuelab.lab.runs.modes import CAMPAIGN_CRASH_MODES, CRASH_MODES, FAILOVER, POWER_LOSS
from crashqueuelab.systems.contract import System


def check_crash_mode(
    mode: str,
    system: System | None = None,
    *,
    experiment: str = "campaign",
    failover: bool = True,
) -> None:
    """Refuse an unknown mode; for power loss, a machine that cannot provide it (exit 4), and
    an experiment that cannot put the system's data on the power-loss disk; a failover
    outside a campaign the command line runs (``failover``: it can hand the campaign a
    replicated server; the pytest plugin cannot), or of a system that has no PostgreSQL
    server (exit 2)."""
    modes = CAMPAIGN_CRASH_MODES if experiment == "campaign" and failover else CRASH_MODES
    if mode not in modes:
        raise InvalidInput("crash_mode", f"{mode!r} is not one of {', '.join(modes)}")
    if mode == FAILOVER and system is not None and system.server != "postgres":
        raise InvalidInput(
            "crash_mode",
            f"failover: {system.name} runs on {system.server or 'no server'}; the failover"
            " crash mode promotes a PostgreSQL standby (a system on PostgreSQL only)",
        )
    refused = None if system is None else power_loss_refusal(system, experiment)
    if mode == POWER_LOSS and refused is not None:
        raise CrashModeUnavailable(mode, refused)
    if mode == POWER_LOSS:
        require_power_loss()


def power_loss_refusal(system: System, experiment: str = "campaign") -> str | None:
    """Why a power cut cannot be judged on ``system`` in ``experiment`` (None when it can).

    A campaign puts a server's data directory on the disk (a server per case; for a system
    on RabbitMQ, the node's: ``brokerdisk``). Chaos puts only the run's store directory
    there, while a server keeps its data in its own data directory: a cut would lose
    nothing and a pass would prove nothing.
    """
    if system.broker == "rabbitmq" and experiment == "campaign" and system.declare_broker is None:
        return (
            f"{system.name} keeps its messages in a RabbitMQ node and declares nothing the"
            " lab can settle on it before the power comes on (System.declare_broker), so no"
            " campaign puts that node's data directory on the disk (power-cut --publisher cuts"
            " the power under a node)"
        )
    if system.server is None or experiment == "campaign":
        return None
    if system.broker == "rabbitmq":
        return (
            f"{system.name} keeps its messages in a RabbitMQ node, whose data directory"
            f" {experiment}'s power-loss disk does not hold (campaign --crash-mode power-loss"
            " puts it on the disk; power-cut --publisher cuts the power under a node)"
        )
    return (
        f"{system.name} keeps its data in its {system.server} server's data directory, which"
        " chaos's power-loss disk does not hold (campaign --crash-mode power-loss puts it on"
        " the disk; server crashes during chaos: --server-restarts)"
    )
