"""The lab's checks as a pytest suite any system can run in its own CI: the contract's
behaviour checks, the fencing probes, one crash case per crash point and the model-driven
workload (``crashqueuelab_pytest`` registers them with pytest; ``docs/pytest-plugin.md``)."""
