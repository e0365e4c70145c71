"""Long jobs on a library's own worker loop, no worker harmed: is a live holder's job handed
out again? (``run``: the experiment; ``judge``: its verdict; ``faults``: network faults.)"""
