"""Side-by-side benchmark: crashqueuelab's single-job and batched paths against a textbook queue.

``crashqueuelab bench`` runs every system at several worker counts and handler costs on the
same disk in the same run, so the ratios it reports are meaningful on a noisy machine.
"""
