"""The cluster simulator (issue 10): conservation, the no-I/O bound, monotonicity in capacity, and
agreement with the runtime's own per-epoch decisions (the rank plans every rank computes, and a tiny
Loader run on the emulated store), each with a negative control that must fail."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from clairvoyant.cli.main import main
from clairvoyant.plan.order import epoch_order
from clairvoyant.plan.partition import padded_rest
from clairvoyant.plan.layout import rank_on_node as Layout
from clairvoyant.plan.rank_plan import PlanConfig, plan_rank_epoch
from clairvoyant.plan.rank_plan import cluster_tiers as ClusterSpec
from clairvoyant.plan.residency import simulate_epoch
from clairvoyant.plan.sequence import node_sequence
from clairvoyant.sim import Hardware, Job, StoreModel, dataset_sizes, simulate
from clairvoyant.sim.engine import run_policy
from clairvoyant.sim.policies import (ClusterPolicy, NodeTierPolicy, POLICIES, StorePolicy, make_policy,
                                      node_sequences, node_tier_epoch)

OVERHEAD = 32


def small(nodes=3, gpus=2, batch=4, epochs=3, step=0.01, seed=0, drop_last=False) -> Job:
    return Job(nodes=nodes, gpus=gpus, batch_size=batch, step_time=step, epochs=epochs, seed=seed,
               drop_last=drop_last)


def slow_store() -> StoreModel:
    return StoreModel.emulated(open_latency=0.002, read_latency=0.001, bandwidth=50e6, max_inflight=16,
                               sample_bytes=2000)


def hw_for(sizes: np.ndarray, fraction: float, **kw) -> Hardware:
    total = int(sizes.sum()) + OVERHEAD * len(sizes)
    return Hardware(store=kw.pop("store", slow_store()), local_capacity=int(fraction * total), window=10**6, **kw)


# --- the plan's sequences, as the simulator builds them for all nodes at once -------------------------

@pytest.mark.parametrize("n,nodes,gpus,batch,drop_last", [(101, 3, 2, 4, False), (96, 2, 4, 5, True),
                                                          (50, 4, 1, 3, False), (7, 2, 2, 8, False)])
def test_node_sequences_are_the_runtimes_node_sequence(n, nodes, gpus, batch, drop_last):
    job = small(nodes, gpus, batch, drop_last=drop_last)
    for epoch in (0, 1):
        ns = node_sequences(n, job, epoch)
        for k in range(nodes):
            ref = node_sequence(n, seed=0, epoch=epoch, world_size=nodes * gpus,
                                ranks=range(k * gpus, (k + 1) * gpus), batch_size=batch, drop_last=drop_last)
            assert np.array_equal(ns.seq[k], ref), (epoch, k)
        assert ns.step[-1] == job.steps(n) - 1 and (np.diff(ns.step) >= 0).all()
    # negative control: another seed's sequences are not the runtime's
    other = node_sequences(n, Job(nodes=nodes, gpus=gpus, batch_size=batch, step_time=0, seed=1,
                                  drop_last=drop_last), 0)
    ref0 = node_sequence(n, seed=0, epoch=0, world_size=nodes * gpus, ranks=range(gpus), batch_size=batch,
                         drop_last=drop_last)
    assert not np.array_equal(other.seq[0], ref0)


@pytest.mark.parametrize("unread", [0, 20_000])   # renumbered through a mask / by sorting (a small share)
def test_a_node_renumbered_takes_the_same_decisions(unread):
    """node_tier_epoch runs simulate_epoch over the node's samples renumbered: the same hits, keeps
    and residents as over global indices, with residents carried in; a different capacity (the
    control) changes them. ``unread``: samples the sequences never touch, appended to the sizes."""
    sizes = np.concatenate([dataset_sizes(400, 3000, sigma=0.6, seed=3) + OVERHEAD, np.full(unread, 5000)])
    kw = dict(seed=0, world_size=4, ranks=range(0, 2), batch_size=5)
    seq0, seq1, seq2 = (node_sequence(400, epoch=e, **kw) for e in (0, 1, 2))
    cap = int(0.3 * sizes[seq0].sum())
    ref = simulate_epoch(seq0, seq1, sizes, cap, {})
    got, after = node_tier_epoch(seq0, seq1, sizes, cap, {})
    assert np.array_equal(ref.hit, got.hit) and np.array_equal(ref.keep, got.keep)
    assert dict(after) == dict(ref.residents_after)
    ref1 = simulate_epoch(seq1, seq2, sizes, cap, ref.residents_after)
    got1, after1 = node_tier_epoch(seq1, seq2, sizes, cap, after)
    assert np.array_equal(ref1.hit, got1.hit) and dict(after1) == dict(ref1.residents_after)
    assert ref1.hit.any() and not ref1.hit.all()
    other, _ = node_tier_epoch(seq1, seq2, sizes, cap // 3, after)
    assert not np.array_equal(other.hit, ref1.hit)


# --- conservation -------------------------------------------------------------------------------------

def expected_bytes(n: int, sizes: np.ndarray, job: Job, epoch: int) -> int:
    """An independent count of the bytes an epoch reads: the padded order, cut per rank."""
    W = job.world_size
    per_rank = padded_rest(epoch_order(n, job.seed, epoch), W).reshape(-1, W)
    if job.drop_last:
        per_rank = per_rank[:per_rank.shape[0] // job.batch_size * job.batch_size]
    return int(sizes[per_rank.reshape(-1)].sum())


@pytest.mark.parametrize("policy", POLICIES)
def test_every_access_is_served_once_and_the_bytes_add_up(policy):
    sizes = dataset_sizes(250, 2000, sigma=0.5, seed=1)
    job = small(3, 2, 4)
    for t in make_policy(policy, job, sizes, hw_for(sizes, 0.3)).epochs():
        t.check()
        tot = t.totals()
        assert tot["samples"] == math.ceil(250 / 6) * 6
        assert tot["bytes"] == expected_bytes(250, sizes, job, t.epoch)
        assert tot["local_b"] + tot["peer_b"] + tot["store_b"] == tot["bytes"]
    if policy == "cluster":
        assert tot["peer_n"] > 0 and tot["sent_b"] == tot["peer_b"]


class DoubleCounting(ClusterPolicy):
    """Broken on purpose: a peer read is also counted as a store read."""

    def epochs(self):
        for t in super().epochs():
            t.store_n = t.store_n + t.peer_n
            t.store_b = t.store_b + t.peer_b
            yield t


class LosesSends(ClusterPolicy):
    """Broken on purpose: what a home sends is forgotten."""

    def epochs(self):
        for t in super().epochs():
            t.sent_b = t.sent_b // 2
            yield t


@pytest.mark.parametrize("broken", [DoubleCounting, LosesSends])
def test_conservation_catches_a_broken_policy(broken):
    sizes = dataset_sizes(250, 2000, sigma=0.5, seed=1)
    with pytest.raises(AssertionError):
        for t in broken(small(3, 2, 4), sizes, hw_for(sizes, 0.3)).epochs():
            t.check()


def test_the_cluster_counts_through_the_stable_views_agree():
    """The fast path (the plan's per-access arrays) and for_node views count the same traffic."""
    sizes = dataset_sizes(300, 2000, sigma=0.5, seed=2)
    job, hw = small(4, 2, 4), hw_for(sizes, 0.2)
    fast = list(ClusterPolicy(job, sizes, hw).epochs())
    views = list(ClusterPolicy(job, sizes, hw, per_node_views=True).epochs())
    for a, b in zip(fast, views):
        for k in ("samples", "local_n", "local_b", "peer_n", "peer_b", "sent_n", "sent_b", "store_n", "store_b",
                  "write_n", "write_b"):
            assert np.array_equal(getattr(a, k), getattr(b, k)), k


# --- the no-I/O lower bound ---------------------------------------------------------------------------

def check_bound(sim) -> None:
    bound = sim.run("no-io")
    for r in sim.runs:
        for e, b in zip(r.epochs, bound.epochs):
            if e.seconds < b.seconds - 1e-9 or e.stall < -1e-12:
                raise AssertionError(f"{r.policy} epoch {e.epoch}: {e.seconds} s beats the no-I/O bound {b.seconds} s")


@pytest.mark.parametrize("fraction,step", [(0.0, 0.01), (0.3, 0.0), (0.3, 0.05), (2.0, 0.001)])
def test_no_policy_beats_the_no_io_bound(fraction, step):
    sizes = dataset_sizes(300, 2000, sigma=0.5, seed=4)
    job = small(3, 2, 4, step=step)
    sim = simulate(job, sizes, hw_for(sizes, fraction, decode_rate=5000, cores=1))
    check_bound(sim)
    nb = sim.run("no-io")
    assert all(abs(e.seconds - e.steps * step) < 1e-9 and e.stall == 0 for e in nb.epochs)
    assert sim.run("store-only").seconds >= sim.run("staging").seconds - 1e-9


class DropsTheLastStep(StorePolicy):
    """Broken on purpose: the epoch's last batch is never loaded (and never trained on)."""

    def epochs(self):
        for t in super().epochs():
            for k in ("samples", "bytes", "local_n", "local_b", "peer_n", "peer_b", "sent_n", "sent_b",
                      "store_n", "store_b", "write_n", "write_b"):
                setattr(t, k, getattr(t, k)[:-1])
            yield t


def test_the_bound_check_catches_an_epoch_that_skips_work():
    sizes = dataset_sizes(300, 2000, sigma=0.5, seed=4)
    job, hw = small(3, 2, 4, step=0.05), hw_for(sizes, 0.3)
    sim = simulate(job, sizes, hw, ("staging", "no-io"))
    check_bound(sim)
    broken = run_policy(DropsTheLastStep(job, sizes, hw, staged=True).epochs(), hw, job,
                        dataset_bytes=int(sizes.sum()), num_samples=len(sizes))
    sim.runs[0] = broken
    with pytest.raises(AssertionError, match="beats the no-I/O bound"):
        check_bound(sim)


# --- monotonicity: more capacity never reads more from the store --------------------------------------

def store_by_capacity(policy_cls, fractions, sizes, job) -> list[list[int]]:
    out = []
    for f in fractions:
        ts = list(policy_cls(job, sizes, hw_for(sizes, f)).epochs())
        out.append([int(t.store_b.sum()) for t in ts])
    return out


def check_monotone(rows: list[list[int]]) -> None:
    jobs = [sum(r) for r in rows]
    for a, b in zip(jobs, jobs[1:]):
        if b > a:
            raise AssertionError(f"more capacity read more from the store: {jobs}")


FRACTIONS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5)


@pytest.mark.parametrize("policy_cls", [NodeTierPolicy, ClusterPolicy])
def test_more_capacity_never_reads_more_from_the_store(policy_cls):
    sizes = dataset_sizes(360, 2000)   # equal sizes: farthest-next-use is then a stack algorithm
    job = small(3, 2, 4, epochs=3)
    rows = store_by_capacity(policy_cls, FRACTIONS, sizes, job)
    check_monotone(rows)
    assert sum(rows[0]) == 3 * expected_bytes(360, sizes, job, 0) and sum(rows[-1]) < sum(rows[0])


class InvertedCapacity(NodeTierPolicy):
    """Broken on purpose: the tier gets what is left of the data set after the capacity."""

    def __init__(self, job, sizes, hw, **kw):
        total = int(sizes.sum()) + OVERHEAD * len(sizes)
        super().__init__(job, sizes, hw.with_(local_capacity=max(0, total - hw.local_capacity)), **kw)


def test_the_monotonicity_check_catches_a_broken_policy():
    sizes = dataset_sizes(360, 2000)
    with pytest.raises(AssertionError, match="more capacity"):
        check_monotone(store_by_capacity(InvertedCapacity, FRACTIONS[:-1], sizes, small(3, 2, 4)))


# --- agreement with the runtime's own per-epoch decisions -----------------------------------------------

def runtime_counts(sizes: np.ndarray, job: Job, capacity: int, cluster: bool) -> list[dict[str, list[int]]]:
    """Per epoch, per node: samples read from the node's tier, from peers and from the store, as
    every rank's plan_rank_epoch (what the Loader carries out) says, residents carried as the
    Loader carries them."""
    entry = sizes + OVERHEAD
    cfg = PlanConfig(len(sizes), job.batch_size, job.seed)
    nodes = tuple(range(n * job.gpus, (n + 1) * job.gpus) for n in range(job.nodes))
    held_node = [{} for _ in nodes]
    held_cluster = None
    out = []
    for e in range(job.epochs):
        row = {"own": [0] * job.nodes, "peer": [0] * job.nodes, "store": [0] * job.nodes, "write": [0] * job.nodes}
        nxt_node, nxt_cluster = list(held_node), held_cluster
        for n, ranks in enumerate(nodes):
            for r in ranks:
                layout = Layout(r, job.world_size, ranks)
                spec = (ClusterSpec(nodes, n, (capacity,) * job.nodes, tuple(held_cluster or ()))
                        if cluster else None)
                p = plan_rank_epoch(entry, cfg, layout, epoch=e, capacity=capacity, residents=held_node[n],
                                    cluster=spec)
                hit = np.concatenate(p.hit)
                peer = np.concatenate(p.peer) if p.peer is not None else np.full(len(hit), -1)
                row["own"][n] += int(hit.sum())
                row["peer"][n] += int((~hit & (peer >= 0)).sum())
                row["store"][n] += int((~hit & (peer < 0)).sum())
                row["write"][n] += int((np.concatenate(p.keep) & ~hit & (peer < 0)).sum())
                nxt_node[n] = p.residents_after
                nxt_cluster = p.cluster_residents
        held_node, held_cluster = nxt_node, nxt_cluster
        out.append(row)
    return out


def sim_counts(policy_cls, sizes, job, capacity) -> list[dict[str, list[int]]]:
    hw = hw_for(sizes, 0).with_(local_capacity=capacity)
    return [{"own": t.local_n.sum(0).tolist(), "peer": t.peer_n.sum(0).tolist(), "store": t.store_n.sum(0).tolist(),
             "write": t.write_n.sum(0).tolist()} for t in policy_cls(job, sizes, hw).epochs()]


@pytest.mark.parametrize("cluster", [False, True])
@pytest.mark.parametrize("nodes,gpus", [(1, 2), (2, 2), (3, 1)])
def test_the_simulator_agrees_with_every_ranks_plan(cluster, nodes, gpus):
    sizes = dataset_sizes(150, 2000, sigma=0.5, seed=5)
    job = small(nodes, gpus, 4, epochs=3)
    cap = int(0.25 * (sizes + OVERHEAD).sum())
    want = runtime_counts(sizes, job, cap, cluster)
    got = sim_counts(ClusterPolicy if cluster else NodeTierPolicy, sizes, job, cap)
    assert got == want
    assert sum(sum(r["own"]) + sum(r["peer"]) for r in want) > 0
    # negative control: the simulator on another seed disagrees with the runtime's plans
    other = sim_counts(ClusterPolicy if cluster else NodeTierPolicy, sizes,
                       Job(nodes=nodes, gpus=gpus, batch_size=4, step_time=0.01, epochs=3, seed=9), cap)
    assert other != want


def test_the_simulator_agrees_with_a_real_loader_run(dataset, tmp_path):
    """One process, the emulated store (no latency), 50% local tier, 3 epochs: the store's own byte
    counter per epoch against the simulator's prediction for 1 node x 1 GPU."""
    from clairvoyant import Loader
    from clairvoyant.testing import EmulatedStore

    store = EmulatedStore(dataset, open_latency=0, read_latency=0, bandwidth=1e12,
                          state_dir=str(tmp_path / "emu"))
    ld = Loader(store, batch_size=8, local_dir=str(tmp_path / "local"), local_capacity="50%", num_workers=1,
                decode=len, output="numpy", stage_threads=2, cluster=False)
    measured = []
    try:
        for e in range(3):
            store.reset()
            ld.set_epoch(e)
            for _ in ld:
                pass
            measured.append(store.counters().bytes)
        sizes = np.asarray(ld.manifest.sizes, dtype=np.int64)
        cap = ld.tiers.local_capacity
    finally:
        ld.close()
    job = Job(nodes=1, gpus=1, batch_size=8, step_time=0, epochs=3)
    predicted = [int(t.store_b.sum()) for t in NodeTierPolicy(job, sizes, hw_for(sizes, 0).with_(
        local_capacity=cap)).epochs()]
    assert predicted == measured, (predicted, measured)
    assert measured[0] == int(sizes.sum()) and measured[1] < measured[0]
    # negative control: the prediction for a tier a third as large does not match
    wrong = [int(t.store_b.sum()) for t in NodeTierPolicy(job, sizes, hw_for(sizes, 0).with_(
        local_capacity=cap // 3)).epochs()]
    assert wrong != measured


# --- the models ---------------------------------------------------------------------------------------

def test_store_model_curve_and_service_time():
    s = StoreModel.from_points({1: 330e6, 8: 2870e6})
    assert s.bandwidth(1) == pytest.approx(330e6) and s.bandwidth(8) == pytest.approx(2870e6)
    assert s.bandwidth(1024) == pytest.approx(2870e6)          # flat beyond the curve
    assert s.bandwidth(4.5) == pytest.approx((330e6 + 2870e6) / 2)
    t = s.service_time(np.array([0, 100, 100]), np.array([0, 2870e6, 2870e6]), np.array([8, 8, 1]))
    assert t[0] == 0 and t[1] == pytest.approx(1.0) and t[2] == pytest.approx(2870 / 330)
    lat = StoreModel.from_points({1: 1e12}, latency=0.01, max_inflight=4)
    assert lat.service_time(np.array([40]), np.array([1]), np.array([64]))[0] == pytest.approx(0.1)
    emu = StoreModel.emulated(open_latency=0.010, read_latency=0.002, bandwidth=400e6, sample_bytes=100_000)
    assert emu.bandwidth(1) == pytest.approx(100_000 / 0.01225) and emu.bandwidth(64) == pytest.approx(400e6)


def test_store_model_from_probe_json(tmp_path):
    probe = {"uri": "file:///data", "latency_s": 0.004, "stat_s": {"p50": 0.004, "p99": 0.01},
             "curve": [{"readers": 1, "files_per_s": 100, "bytes_per_s": 1e7},
                       {"readers": 4, "files_per_s": 350, "bytes_per_s": 3.5e7}]}
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(probe))
    s = StoreModel.from_probe(str(path))
    assert s.latency == 0.004 and s.bandwidth(4) == pytest.approx(3.5e7)
    from clairvoyant.errors import ConfigError
    with pytest.raises(ConfigError, match="probe"):
        StoreModel.from_probe({"curve": [{"readers": 1}]})


def test_a_slow_store_binds_and_a_fast_one_does_not():
    sizes = dataset_sizes(300, 2000)
    job = small(2, 2, 4, step=0.001)   # 16 reads of 3 ms a step over 16 slots: 3 ms > 1 ms
    slow = simulate(job, sizes, hw_for(sizes, 0.3), ("staging",)).runs[0]
    fast = simulate(job, sizes, hw_for(sizes, 0.3, store=StoreModel.from_points({1: 1e12})), ("staging",)).runs[0]
    assert slow.bound_by == "store" and slow.stall_share > 0.5
    assert fast.bound_by == "compute" and fast.stall_share < 0.05


# --- the command line ---------------------------------------------------------------------------------

def test_cli_simulate_json(capsys):
    rc = main(["simulate", "--nodes", "4", "--gpus", "2", "--samples", "2k", "--sample-size", "10KB",
               "--local-capacity", "30%", "--epochs", "2", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    got = {p["policy"]: p for p in out["policies"]}
    assert set(got) == set(POLICIES)
    assert got["cluster"]["store_per_job"] <= got["node"]["store_per_job"]
    assert got["no-io"]["stall_share"] == 0


def test_cli_simulate_sweep_and_plot(tmp_path, capsys):
    png = tmp_path / "sweep.png"
    rc = main(["simulate", "--gpus", "2", "--samples", "1000", "--sample-size", "10KB", "--epochs", "2",
               "--sweep", "both", "--sweep-nodes", "1,2,4", "--sweep-ratios", "0.5,2,8", "--policies",
               "node,cluster,no-io", "--plot", str(png)])
    assert rc == 0 and png.stat().st_size > 10_000
    text = capsys.readouterr().out
    assert "nodes 4" in text and "exceeds the cluster" in text


def test_cli_plan_answers_what_ifs_through_the_simulator(capsys):
    rc = main(["plan", "--batch-size", "32", "--step-time", "0.2", "--sample-size", "100KB", "--dataset-size",
               "200MB", "--nodes", "4", "--gpus", "2", "--local-capacity", "400GiB", "--simulate", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    # a node's own tier holds only what its ranks read: a quarter of the second epoch on 4 nodes
    assert out["hit_rate"] == 0.25 and out["hit_rate_limit"] == 1.0 and "simulation" in out
    pol = {p["policy"]: p for p in out["simulation"]["policies"]}
    # the budget and the simulator agree on per-node tiers; the cluster cache reads nothing again
    assert abs(pol["node"]["store_per_epoch"][1] - (1 - out["hit_rate"])) < 0.05
    assert pol["cluster"]["store_per_epoch"][1] == 0
