"""A rank alive but stuck under ``mpirun`` (issue 51): its peers' collectives are bounded by the same
``GATHER_TIMEOUT`` as the torch store's gathers (cluster/mpi.py), and the stuck rank is named by
the one probe (its count of gathers entered, then whether it answers). Three ranks as three nodes
(tests/cluster/mpi_stuck_script.py), the time-out set to 8 s: rank 2 stops (SIGSTOP) after making
its Loader. Ranks 0 and 1 each stop with a ``PeerLost`` naming rank 2 and the way on within 2x
the time-out, and the job ends by its advice (``comm.Abort()``). Control: rank 2 only slow, within
the time-out: the job finishes its epoch on every rank."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest

from clairvoyant.testing import make_dataset
from mpi_util import launch, needs_mpirun

SCRIPT = Path(__file__).with_name("mpi_stuck_script.py")
TIMEOUT = 8.0


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> str:
    return make_dataset(str(tmp_path_factory.mktemp("stuck") / "imgs"), 48, num_classes=4, size=16)


def _run(small: str, work: Path, mode: str) -> tuple[int, str, dict[int, dict]]:
    token = f"cvstuck-{uuid.uuid4().hex}"
    rc, _, err = launch([sys.executable, str(SCRIPT), small, str(work), mode, token], token, n=3, timeout=120,
                        env={"CLAIRVOYANT_GATHER_TIMEOUT": str(TIMEOUT), "OMPI_MCA_btl": "self,tcp"})
    return rc, err, {r: json.loads((work / f"out-{r}.json").read_text()) for r in (0, 1)
                     if (work / f"out-{r}.json").exists()}


@needs_mpirun
@pytest.mark.timeout(200)
def test_a_stopped_rank_is_named_within_twice_the_time_out(small, tmp_path):
    rc, err, out = _run(small, tmp_path, "stop")
    assert sorted(out) == [0, 1], err[-3000:]
    for r in (0, 1):
        o = out[r]
        assert o["end"] == "PeerLost", (r, o, err[-2000:])
        assert o["text"].startswith("rank(s) [2] of this job's 3"), o["text"]
        assert "rank(s) [2] answer no probe: lost" in o["text"] and "state_dict" in o["text"], o["text"]
        assert "comm.Abort()" in o["text"], o["text"]
        assert o["seconds"] <= 2 * TIMEOUT, o
    assert rc != 0   # the job ended by comm.Abort, as the advice says (no rank left: launch checks)


@needs_mpirun
@pytest.mark.timeout(200)
def test_control_a_rank_slow_within_the_time_out_finishes(small, tmp_path):
    rc, err, out = _run(small, tmp_path, "slow")
    assert rc == 0, err[-3000:]
    assert [out[r]["end"] for r in (0, 1)] == ["done", "done"], out
    assert sum(out[r]["samples"] for r in (0, 1)) == 48 * 2 // 3, out
