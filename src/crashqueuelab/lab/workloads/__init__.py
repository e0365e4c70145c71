"""What a system is asked to do in a run: the scripted crash-case scenario, the seeded model
workload, the worker boundary and its handlers, and the effect ledger that counts effects."""
