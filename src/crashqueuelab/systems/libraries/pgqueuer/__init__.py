"""pgqueuer under the lab."""
