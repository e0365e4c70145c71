"""The laboratory: every way the lab runs a system, breaks it and judges it.

One package per concept, in the order they may import one another (``tests/test_layers.py``):

- ``runs``: what every run shares (its record and directory, interrupts, progress, the
  servers it starts, the command lines its page prints, the one registry of run kinds);
- ``workloads``: what a system is asked to do (the scripted scenario, the model workload,
  the worker boundary, the effect ledger);
- ``faults``: how a run is broken (crash hooks and children, crash modes, lost replies, the
  network fault proxy, the power-loss disk);
- the experiments: ``campaign`` (crash points, probes), ``chaos``, ``heartbeats``,
  ``bench``, ``versions``;
- ``reproducers``: a failure shrunk to its smallest rerun and exported as a pytest file;
- ``mutants``, ``demo``, ``showcase``: compositions of the experiments;
- ``pages``: the report a person reads, built from a run's retained files alone.
"""
