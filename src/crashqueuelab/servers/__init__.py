"""Throwaway servers the lab starts for a run: each starts in a temporary directory, waits
until it is ready, says what it is, and is stopped by whoever started it, also on failure."""
