"""Third-party queues under the lab, one package per library: its client (the library's own
calls), its crash points, what it documents of itself, and its factory."""
