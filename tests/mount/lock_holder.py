"""A process of the node copying files into a mount's tier, for tests/mount/test_mount.py: it holds
the node-wide locks of the keys given (``argv``: local_dir, source uri, source root, keys), says
"held", then takes lines on stdin: ``publish KEY`` writes that key's entry from the source file,
``release`` lets go of every lock and ends. (A process of its own: POSIX record locks belong to a
process, so the test's own, which runs the mount's staging, cannot stand for another.)"""

import os
import sys

from clairvoyant.cache.local import LocalStore

local_dir, uri, root, keys = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
store = LocalStore(local_dir, uri)
for k in keys:
    if store.claim(k, os.path.getsize(os.path.join(root, k))):
        sys.exit(f"{k} is staged already")
print("held", flush=True)
for line in sys.stdin:
    op, *arg = line.split()
    if op == "publish":
        path = os.path.join(root, arg[0])
        with open(path, "rb") as f:
            store.put(arg[0], f.read(), os.stat(path).st_mtime_ns, 1 << 30)
        print("published", flush=True)
    elif op == "release":
        for k in keys:
            store.release(k)
        break
