"""Failover runs: the PostgreSQL queue on a primary with a streaming standby behind a fault
proxy, the primary killed while the standby lags, the standby promoted, the clients moved.

``run.run_failover`` keeps a load on the queue (``workload``), makes the failovers on the
replicated server (``cluster``), and ``judge`` holds what the queue told its callers against
what the promoted servers kept, level by level (``promises``: PostgreSQL's own words).
"""
