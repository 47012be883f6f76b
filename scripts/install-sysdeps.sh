#!/bin/sh
# System packages that some optional parts of clairvoyant need.
# To build clairvoyant (pip install, pip wheel) with its two FUSE daemons, `clairvoyant mount`'s
# (mount/mountfs.c) and the kernel-path emulated store's (clairvoyant.testing.FuseStore,
# testing/emufs.c), which setup.py compiles with the package, never at run time:
#   libfuse3-dev, pkg-config: libfuse3's headers (the daemons load the library itself at run time);
#   libxxhash-dev: xxhash's header, compiled into mountfs (it checks staged entries with xxh3)
#   and the C stager; and a C compiler (cc).
# To run them (every node that mounts; no compiler nor headers needed there):
#   fuse3: fusermount3 and FUSE 3's shared library libfuse3.so.3 (Debian's libfuse3-3), and /dev/fuse.
# Already there: nothing to do. Root with apt-get: installed quietly. Otherwise: says what to
# install and exits 0 (the tests that need them skip, naming the reason).
set -eu

have() { command -v "$1" >/dev/null 2>&1; }

if have cc && have pkg-config && pkg-config --exists fuse3 && pkg-config --exists libxxhash && have fusermount3; then
    exit 0
fi

if [ "$(id -u)" = 0 ] && have apt-get; then
    echo "install-sysdeps: installing gcc libc6-dev fuse3 libfuse3-dev libxxhash-dev pkg-config with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends gcc libc6-dev fuse3 libfuse3-dev libxxhash-dev pkg-config >/dev/null
    exit 0
fi

echo "install-sysdeps: some of gcc, fuse3, libfuse3-dev, libxxhash-dev and pkg-config are missing (Debian/Ubuntu" \
     "names; gcc, fuse3, fuse3-devel and xxhash-devel on Fedora). Install them as root, then install clairvoyant" \
     "again to build its FUSE daemons (clairvoyant mount, the FUSE store's tests and benchmark; they skip" \
     "without them)." >&2
exit 0
