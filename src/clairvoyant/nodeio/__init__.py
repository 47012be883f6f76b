"""MECHANISM: I/O on the node's own file systems, shared by every part: atomic writes and process
liveness (``fileio``), descriptors kept per process (``fdcache``), where the per-user cache lives
(``paths``), and the C helper that reads a file's bytes and metadata in one call (``_fastio.c``)."""
