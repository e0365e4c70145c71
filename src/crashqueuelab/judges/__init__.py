"""The judges: an independent replay of the history and database-wide invariant checks.

They read a retained database through their own read-only connection and their own SQL,
and import nothing of the queue they judge (a test enforces it), so a bug in a transition
cannot hide itself by being shared with the code that checks it.
"""
