"""HTML reports a person reads: one self-contained ``report.html`` per run, built from the
run's retained files alone (``crashqueuelab report DIR`` rebuilds it)."""
