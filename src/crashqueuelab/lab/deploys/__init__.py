"""Deploys: workers stopped as every process manager stops them, a signal, a grace
period, then SIGKILL (``plan``: the rollout; ``fleet``: the processes and the signals;
``workers``: a worker process; ``labworker``: the lab's own worker; ``judge``; ``run``)."""
