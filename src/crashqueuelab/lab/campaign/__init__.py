"""The crash campaign: one real child per crash point (or a power cut there), the fencing
probes and the model workload, each judged from the retained store."""
