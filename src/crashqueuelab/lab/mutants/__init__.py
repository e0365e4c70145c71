"""Mutants: planted bugs in the shipped systems, and the run that shows which evidence of the
lab catches each one."""
