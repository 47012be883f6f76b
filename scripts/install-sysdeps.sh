#!/bin/sh
# System packages that some optional parts of clairvoyant need:
#   fuse3, libfuse3-dev, pkg-config: the kernel-path emulated store (clairvoyant.testing.FuseStore),
#   whose daemon is compiled from C on first use.
#   libxxhash-dev: `clairvoyant mount`'s daemon (mount/mountfs.c) checks staged entries with xxh3.
# Already there: nothing to do. Root with apt-get: installed quietly. Otherwise: says what to
# install and exits 0 (the tests that need them skip, naming the reason).
set -eu

have() { command -v "$1" >/dev/null 2>&1; }

if have pkg-config && pkg-config --exists fuse3 && pkg-config --exists libxxhash && have fusermount3; then
    exit 0
fi

if [ "$(id -u)" = 0 ] && have apt-get; then
    echo "install-sysdeps: installing fuse3 libfuse3-dev libxxhash-dev pkg-config with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends fuse3 libfuse3-dev libxxhash-dev pkg-config >/dev/null
    exit 0
fi

echo "install-sysdeps: fuse3, libfuse3-dev, libxxhash-dev and pkg-config are missing (Debian/Ubuntu names;" \
     "fuse3, fuse3-devel and xxhash-devel on Fedora). Install them as root to run the FUSE store's tests and" \
     "benchmark; they skip without them." >&2
exit 0
