"""MECHANISM: what every libfuse3 daemon of clairvoyant needs from Python: build, mount, tear down.

Two daemons use it: ``testing/emufs.c`` (the emulated slow store, ``FuseStore``)
and ``mount/mountfs.c`` (``clairvoyant mount``). Each is compiled from its C
source on first use into ``cache_home()/bin``, under a name holding a hash of
the source (and of the compiler flags), atomically: a temporary name, then a
rename, so concurrent first uses never collide and a changed source is rebuilt.
A mount is ready once it appears in ``/proc/mounts``; teardown unmounts with
``fusermount3`` (lazily if a file is still open), reaps the daemon (killing it
if it lingers) and removes the temporary directory: nothing is left behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Sequence

from .errors import SourceError
from .paths import cache_home

COMMON_HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuse_common.h")  # both daemons'
TIER_FORMAT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cache", "tier_format.h")  # mountfs's
INSTALL_HINT = ("run scripts/install-sysdeps.sh (Debian: apt-get install fuse3 libfuse3-dev libxxhash-dev "
                "pkg-config)")


class Daemon:
    """A libfuse3 daemon built from one C file, linked with the pkg-config packages ``packages``."""

    def __init__(self, source: str, name: str, packages: Sequence[str] = ("fuse3",)) -> None:
        self.source, self.name, self.packages = source, name, tuple(packages)

    def binary_path(self) -> str:
        h = hashlib.sha256()
        for part in (self.source, COMMON_HEADER, TIER_FORMAT):
            with open(part, "rb") as f:
                h.update(f.read())
        h.update("\0".join(self.packages).encode())
        return os.path.join(cache_home(), "bin", f"{self.name}-{h.hexdigest()[:16]}")

    def available(self) -> tuple[bool, str]:
        """Whether the daemon can be built (or was) and mounted here; when not, why and what to install."""
        if not os.path.exists("/dev/fuse"):
            return False, "no /dev/fuse: load the fuse module (modprobe fuse), or start the container with --device /dev/fuse"
        fusermount = shutil.which("fusermount3")
        if fusermount is None:
            return False, f"no fusermount3 on PATH: {INSTALL_HINT}"
        if os.geteuid() != 0 and not os.access("/dev/fuse", os.R_OK | os.W_OK) \
                and not os.stat(fusermount).st_mode & 0o4000:
            return False, "/dev/fuse is not readable and writable by this user, and fusermount3 is not setuid root"
        if os.access(self.binary_path(), os.X_OK):
            return True, ""  # built before: neither compiler nor headers needed
        if shutil.which("pkg-config") is None:
            return False, f"no pkg-config: {INSTALL_HINT}"
        for pkg in self.packages:
            if subprocess.run(["pkg-config", "--exists", pkg], capture_output=True).returncode != 0:
                return False, f"no {pkg} headers (pkg-config {pkg} fails): {INSTALL_HINT}"
        if shutil.which("cc") is None:
            return False, f"no C compiler (cc) to build the {self.name} daemon: install gcc or clang"
        return True, ""

    def binary(self) -> str:
        """The daemon's executable, compiled first if needed."""
        path = self.binary_path()
        if os.access(path, os.X_OK):
            return path
        ok, why = self.available()
        if not ok:
            raise SourceError(f"cannot build the {self.name} daemon from {self.source}: {why}")
        bindir = os.path.dirname(path)
        os.makedirs(bindir, mode=0o700, exist_ok=True)
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", *self.packages], capture_output=True,
                               text=True, check=True).stdout.split()
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=bindir)
        os.close(fd)
        try:
            r = subprocess.run(["cc", "-O2", "-Wall", "-I", os.path.dirname(COMMON_HEADER), "-o", tmp, self.source, *flags,
                                "-lpthread"],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise SourceError(f"compiling {self.source} failed (cc exit {r.returncode}); are the headers of "
                                  f"{', '.join(self.packages)} installed? The compiler said:\n{r.stderr.strip()}")
            os.chmod(tmp, 0o755)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return path


def _unescape(field: str) -> str:
    """/proc/mounts writes space, tab, newline and backslash in octal (\\040)."""
    return field.encode("latin-1").decode("unicode_escape") if "\\" in field else field


def mounted(path: str) -> bool:
    """Whether ``path`` is a FUSE mount point now (by /proc/mounts)."""
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and parts[2].startswith("fuse") and _unescape(parts[1]) == path:
                return True
    return False


def log_tail(log: str, limit: int = 2000) -> str:
    try:
        with open(log, errors="replace") as f:
            text = f.read().strip()
    except OSError:
        return "(no daemon log)"
    return text[-limit:] or "(the daemon printed nothing)"


def check_mountpoint(mnt: str) -> str:
    """``mnt`` made absolute, checked to be an existing empty directory that is not a mount yet."""
    from .errors import ConfigError

    mnt = os.path.realpath(os.fspath(mnt))
    if not os.path.isdir(mnt) or os.listdir(mnt):
        raise ConfigError(f"mountpoint {mnt} must be an existing empty directory")
    if mounted(mnt):
        raise ConfigError(f"{mnt} is already a FUSE mount point: unmount it (fusermount3 -u {mnt}, or "
                          f"clairvoyant umount {mnt}) or choose another")
    return mnt


def start(cmd: list[str], log: str, pass_fds: Sequence[int] = ()) -> subprocess.Popen:
    """Start a daemon in a session of its own (a Ctrl-C in the terminal must not unmount under the
    caller's feet), its output to ``log``."""
    with open(log, "w") as logf:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True,
                                pass_fds=tuple(pass_fds))


def wait_mounted(proc: subprocess.Popen, mnt: str, log: str, timeout: float, what: str) -> None:
    """Wait until ``mnt`` is in /proc/mounts; SourceError with the daemon's output if it exits or is late."""
    deadline = time.monotonic() + timeout
    while not mounted(mnt):
        if proc.poll() is not None:
            raise SourceError(f"{what} exited (status {proc.returncode}) before mounting {mnt}; it said: "
                              f"{log_tail(log)}")
        if time.monotonic() > deadline:
            raise SourceError(f"{mnt} did not appear in /proc/mounts within {timeout:g} s of starting {what}; its "
                              f"output: {log_tail(log)}. A loaded machine may need a larger ready_timeout")
        time.sleep(0.005)


def unmount(mnt: str) -> bool:
    """``fusermount3 -u``, lazily (``-z``) if the mount is busy; True if it was mounted."""
    if not mounted(mnt):
        return False
    if subprocess.run(["fusermount3", "-u", mnt], capture_output=True).returncode != 0 and mounted(mnt):
        subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True)
    return True


def teardown(proc: subprocess.Popen, mnt: str, work: str | None, own_mnt: bool, held: dict) -> None:
    """Unmount, reap the daemon (killing it if it lingers), remove ``work``. Closes the maps in
    ``held`` first. Safe to run twice."""
    for mm in [held.pop(k) for k in list(held)]:
        with contextlib.suppress(Exception):
            mm.close()
    wait = 5.0
    if mounted(mnt):
        if subprocess.run(["fusermount3", "-u", mnt], capture_output=True).returncode != 0 and mounted(mnt):
            # busy (a file still open on it): detach it now; the daemon would serve the open files
            # until they close, so it is stopped at once
            subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True)
            wait = 0.0
    try:
        proc.wait(wait)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the daemon leaves its loop and unmounts
        try:
            proc.wait(2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if mounted(mnt):  # the daemon died without unmounting
        subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True)
    if own_mnt and not mounted(mnt):
        with contextlib.suppress(FileNotFoundError, OSError):
            os.rmdir(mnt)
    if work is not None:
        shutil.rmtree(work, ignore_errors=True)


__all__ = ["Daemon", "mounted", "log_tail", "check_mountpoint", "start", "wait_mounted", "unmount", "teardown",
           "INSTALL_HINT"]
