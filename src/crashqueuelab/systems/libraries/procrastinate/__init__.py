"""procrastinate under the lab."""
