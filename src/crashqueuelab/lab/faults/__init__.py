"""How a run is broken: crash hooks and crash children, the two crash modes, lost replies,
network faults through a proxy, and the power-loss disk."""
