"""The simulator's node loss (``Job.lost_at``, ``clairvoyant simulate --lose-node-at K``): from
epoch K the job runs on one node fewer, the survivors' tiers as they were. Checked against the
Loader's own run in tests/cluster/test_cluster_elastic.py; here: its shape, conservation, and what
the store pays, each with a control."""

from __future__ import annotations

import numpy as np
import pytest

from clairvoyant.errors import ConfigError
from clairvoyant.sim import Hardware, Job
from clairvoyant.sim.policies import make_policy

SIZES = np.full(960, 1000, np.int64)
CAP = int(0.3 * (SIZES + 32).sum())


def _runs(policy: str, lost_at: int | None) -> list:
    job = Job(nodes=4, gpus=2, batch_size=8, step_time=0.1, epochs=4, lost_at=lost_at)
    return list(make_policy(policy, job, SIZES, Hardware(local_capacity=CAP), overhead=32).epochs())


@pytest.mark.parametrize("policy", ["store-only", "staging", "node", "cluster"])
def test_after_the_loss_the_job_runs_on_the_survivors_and_every_access_is_served_once(policy):
    runs = _runs(policy, 2)
    assert [t.nodes for t in runs] == [4, 4, 3, 3]
    for t in runs:
        t.check()   # (raises where an access is not served exactly once)
        assert int(t.samples.sum()) >= len(SIZES)


def test_the_cluster_pays_the_lost_nodes_share_then_what_three_tiers_cannot_hold():
    lost = [int(t.store_b.sum()) / SIZES.sum() for t in _runs("cluster", 2)]
    kept = [int(t.store_b.sum()) / SIZES.sum() for t in _runs("cluster", None)]
    assert lost[:2] == kept[:2]   # nothing changes before the loss
    assert 0.2 <= lost[2] <= 0.3 and kept[2] < 0.02   # control: without the loss the tiers hold it all
    assert 0.05 <= lost[3] <= 0.2   # 3 tiers of 30% hold 90%: about a tenth from the store


def test_a_loss_is_refused_where_it_cannot_be_modelled():
    with pytest.raises(ConfigError, match="epoch from 1 to 3"):
        Job(nodes=4, gpus=1, batch_size=8, step_time=0.1, epochs=4, lost_at=4)
    with pytest.raises(ConfigError, match="several nodes"):
        Job(nodes=1, gpus=1, batch_size=8, step_time=0.1, epochs=4, lost_at=1)
    with pytest.raises(ConfigError, match="does not model a node's loss"):
        _runs("cluster-lru", 2)
    assert len(_runs("cluster-lru", None)) == 4   # control


def test_the_command_line_models_the_loss(capsys):
    import json

    from clairvoyant.cli.main import main
    args = ["simulate", "--nodes", "4", "--samples", "960", "--sample-size", "100KB", "--local-capacity", "30%",
            "--epochs", "4", "--json"]
    assert main(args + ["--lose-node-at", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {p["policy"] for p in out["policies"]} == {"store-only", "staging", "node", "cluster", "no-io"}
    cluster = next(p for p in out["policies"] if p["policy"] == "cluster")
    assert 0.2 <= cluster["epochs"][2]["store_bytes"] / 96e6 <= 0.3
    assert main(args + ["--policies", "cluster"]) == 0   # control: no loss, nothing from the store at epoch 2
    again = json.loads(capsys.readouterr().out)["policies"][0]
    assert again["epochs"][2]["store_bytes"] < 0.02 * 96e6
