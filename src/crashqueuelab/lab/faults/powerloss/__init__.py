"""Power loss: a disk that forgets every write, create, rename and unlink nobody synced."""
