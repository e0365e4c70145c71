"""The laboratory: effects, worker boundary, faults, campaign, demo, chaos, bench, reports."""
