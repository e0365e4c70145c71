"""huey under the lab."""
