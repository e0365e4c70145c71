"""The PostgreSQL queue: the same contract as the SQLite queue, on a server.

``queue.py`` is the queue (psycopg 3, the ``postgres`` extra), ``schema.py`` its tables and
the trigger that freezes history, ``server.py`` a throwaway server for one run. The lab's
adapter and crash points live in ``crashqueuelab.systems.postgres``; the judges read the
tables with their own SQL (``crashqueuelab.judges.readers.postgres``).
"""
