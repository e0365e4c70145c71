"""Failures made small: delta debugging (``ddmin``), a campaign's failures shrunk and
confirmed (``campaign``), a chaos run's schedule shrunk (``chaos``), a reproducer exported as
a pytest file (``export``), and the reruns an exported test calls (``rerun``)."""
