"""MECHANISM: what every libfuse3 daemon of clairvoyant needs from Python: find it, mount, tear down.

Two daemons use it: ``testing/emufs`` (the emulated slow store, ``FuseStore``) and
``mount/mountfs`` (``clairvoyant mount``). Each is an executable that setup.py builds with
the package, from the C source beside it, and places beside it (in the wheel; in the source
tree for an editable install); nothing is compiled at run time, so a node needs no compiler
or headers, only /dev/fuse, fusermount3 and FUSE 3's shared library, which the daemon loads
itself (``fuse_loader.h``: ``libfuse3.so.3``, or ``$CLAIRVOYANT_LIBFUSE``). A mount is ready
once it appears in ``/proc/mounts``; teardown unmounts with ``fusermount3`` (lazily if a file
is still open), reaps the daemon (killing it if it lingers) and removes the temporary
directory: nothing is left behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from typing import Sequence

from ..errors import SourceError

INSTALL_HINT = "install FUSE 3 (Debian/Ubuntu: apt-get install fuse3; scripts/install-sysdeps.sh does)"
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # a checkout's
LIBFUSE_CHECK_TIMEOUT = 10.0


def _reinstall_hint() -> str:
    """How to get the daemons: they exist only where clairvoyant was built with libfuse3's headers."""
    build = ("install a C compiler, pkg-config, libfuse3-dev and libxxhash-dev (Debian names; "
             "scripts/install-sysdeps.sh installs them)")
    if os.path.exists(os.path.join(_ROOT, "setup.py")) and os.path.isdir(os.path.join(_ROOT, "src", "clairvoyant")):
        # a checkout (an editable install)
        return (f"clairvoyant was built without its FUSE daemons, on a machine without libfuse3's headers: {build}, "
                f"then build it again: pip install -e {_ROOT}")
    return ("clairvoyant was built without its FUSE daemons, on a machine without libfuse3's headers: reinstall it "
            "from a wheel (pip install --force-reinstall --no-deps <the clairvoyant .whl>), or build it from "
            f"source: {build}, then pip install --force-reinstall --no-deps --no-cache-dir <clairvoyant's source "
            "directory or sdist>")


class Daemon:
    """The libfuse3 daemon ``name``, an executable in the package directory ``directory``, put there
    by the package's build (setup.py)."""

    def __init__(self, name: str, directory: str) -> None:
        self.name, self.directory = name, directory

    def binary_path(self) -> str:
        return os.path.join(self.directory, self.name)

    def missing(self) -> str:
        """Why the executable is not there and how to get it."""
        return f"the {self.name} FUSE daemon is not installed (no executable {self.binary_path()}); {_reinstall_hint()}"

    def available(self) -> tuple[bool, str]:
        """Whether the daemon is installed and can mount here; when not, why and what to install."""
        if not os.path.exists("/dev/fuse"):
            return False, "no /dev/fuse: load the fuse module (modprobe fuse), or start the container with --device /dev/fuse"
        fusermount = shutil.which("fusermount3")
        if fusermount is None:
            return False, f"no fusermount3 on PATH: {INSTALL_HINT}"
        if os.geteuid() != 0 and not os.access("/dev/fuse", os.R_OK | os.W_OK) \
                and not os.stat(fusermount).st_mode & 0o4000:
            return False, "/dev/fuse is not readable and writable by this user, and fusermount3 is not setuid root"
        if not os.access(self.binary_path(), os.X_OK):
            return False, self.missing()
        # the daemon loads libfuse3 itself (fuse_loader.h), under this environment (CLAIRVOYANT_LIBFUSE)
        try:
            r = subprocess.run([self.binary_path(), "--check-libfuse"], capture_output=True, text=True,
                               stdin=subprocess.DEVNULL, timeout=LIBFUSE_CHECK_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as e:
            return False, f"cannot run the {self.name} daemon {self.binary_path()}: {e}"
        if r.returncode != 0:
            return False, (r.stderr.strip() or f"the {self.name} daemon {self.binary_path()} cannot load libfuse3 "
                           f"(exit status {r.returncode}): {INSTALL_HINT}")
        return True, ""

    def binary(self) -> str:
        """The daemon's executable; SourceError saying how to get it where the package has none."""
        path = self.binary_path()
        if not os.access(path, os.X_OK):
            raise SourceError(self.missing())
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
    from ..errors import ConfigError

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
