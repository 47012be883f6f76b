"""Probe: would pushing staged bytes into the kernel's page cache (libfuse's notify_store) save the
READ round trip through a FUSE mount, and what does the push cost? (docs/benchmarks.md, seventh
measurement.) Builds notify_store.c (a minimal low-level libfuse file system of 2,000 files of
30 KB: SIGUSR1 pushes every file into the page cache), mounts it, and reads every file with
open(buffering=0) + read + close: cold (each READ served by the daemon), again, then after a push.

    python benchmarks/probes/notify_store.py      (root, /dev/fuse, libfuse3-dev, a C compiler)
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
work = tempfile.mkdtemp(prefix="cv-notify-store-")
exe, M = os.path.join(work, "probe"), os.path.join(work, "m")
os.makedirs(M)
flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True,
                       check=True).stdout.split()
subprocess.run(["cc", "-O2", "-Wall", "-o", exe, os.path.join(HERE, "notify_store.c"), *flags, "-lpthread"],
               check=True)
log = open(os.path.join(work, "log"), "w")
d = subprocess.Popen([exe, M], stderr=log)
time.sleep(0.5)
N = 2000
paths = [f"{M}/f{i}" for i in range(N)]
def dcpu():
    f = open(f"/proc/{d.pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
def drop():
    for p in paths:
        fd = os.open(p, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
def rd(tag):
    t0, c0, d0 = time.perf_counter(), time.process_time(), dcpu()
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            b = f.read()
    assert len(b) == 30000
    n = len(paths)
    print(f"{tag:28s} wall {(time.perf_counter()-t0)/n*1e6:6.1f} us, reader CPU {(time.process_time()-c0)/n*1e6:6.1f}, daemon CPU {(dcpu()-d0)/n*1e6:6.1f} us/file", flush=True)
try:
    for p in paths: os.stat(p)
    for r in range(3):
        drop(); rd("cold (READ to the daemon)")
        rd("cached (after reading)")
        drop()
        d0 = dcpu(); os.kill(d.pid, signal.SIGUSR1); time.sleep(1.0)
        print(f"{'push':28s} daemon CPU {(dcpu()-d0)/N*1e6:6.1f} us/file (incl. 1 s idle)", flush=True)
        rd("after notify_store")
finally:
    subprocess.run(["fusermount3", "-u", M])
    d.wait(5)
    log.close()
    print(open(os.path.join(work, "log")).read())
    subprocess.run(["rm", "-rf", work])
