"""One independent reader per system's store, named as the system: each reads retained
files or a server's tables with its own code, never the system's."""
