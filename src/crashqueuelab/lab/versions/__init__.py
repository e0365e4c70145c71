"""The same evidence over a library's releases: each release in a cached environment of its
own (``environments``), the matrix and the bisection (``matrix``)."""
