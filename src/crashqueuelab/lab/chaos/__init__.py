"""Chaos runs: real SIGKILL and SIGSTOP against worker processes, judged afterwards.

``run.run_chaos`` submits the jobs, starts the workers and a maintenance process from a
fork server (``fleet``), delivers a seeded schedule of faults as the work progresses
(``drive``, through ``lab/faults``' deliverers), and hands the retained databases to
``accounting.judge_run``.
"""
