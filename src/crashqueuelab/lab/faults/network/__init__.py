"""Network faults between a worker and its server: a fault proxy on the loopback interface
(``proxy``) and the fault windows it applies (``windows``)."""
