"""rq under the lab."""
