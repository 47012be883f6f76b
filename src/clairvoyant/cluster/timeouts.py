"""POLICY (constants): how long the cluster waits, for the Loader and the mount alike. Every wait
after which a rank or node counts as late, absent or lost is set here, once; the modules that wait
import it (a test may set one lower on the importing module where it is read at the wait, not
where it is a default argument).

- ``GATHER_TIMEOUT``: every rank's part of an exchange (the fingerprint, the job's secret, a
  mount's joining). Ranks legitimately wait for one that lists a large source first, so it is
  torch.distributed's own default, 30 minutes; ``CLAIRVOYANT_GATHER_TIMEOUT`` sets it. The
  Loader's first-pass exchange under a process group waits at most ``FIRST_PASS_CAP`` of it: a
  rank that never iterates must be named before NCCL's watchdog (10 minutes) ends the job.
- ``PEER_TIMEOUT``: a staging thread's wait for a peer's sample before it reads the shared store
  (the Loader); ``ASK_TIMEOUT``: the same for a mount's file, ``ASK_WAIT_MS`` what its daemon waits.
- ``PROBE_WAIT``: a probe's wait for a peer's answer (asked twice): no answer, the node is lost.
- ``CONTROL_WAIT``: a request for a peer's orders or homes (one that times out passes the peer
  over for 5x that: less than ``GATHER_WAIT``, so a gather can end).
- ``GATHER_WAIT``: a mount's wait for every node's orders of an epoch before it plans alone;
  ``QUICK_WAIT`` for nodes that offered nothing the epoch before either (after which the absent
  are probed).
"""

from __future__ import annotations

import os

GATHER_TIMEOUT = float(os.environ.get("CLAIRVOYANT_GATHER_TIMEOUT", "1800"))
FIRST_PASS_CAP = 300.0
PEER_TIMEOUT = 2.0
ASK_TIMEOUT = 1.0
ASK_WAIT_MS = 2000
PROBE_WAIT = 1.0
CONTROL_WAIT = 2.0
GATHER_WAIT = 20.0
QUICK_WAIT = 2.0
