"""Chaos runs: real SIGKILL and SIGSTOP against worker processes, judged afterwards.

``supervisor.run_chaos`` submits the jobs, starts the workers and a maintenance process
from a fork server, delivers a seeded schedule of signals, and hands the retained databases
to ``accounting.judge_run``.
"""
