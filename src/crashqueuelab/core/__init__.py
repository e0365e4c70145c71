"""The SQLite-WAL job queue: the default system under test, stdlib only."""
