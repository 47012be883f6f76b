"""`clairvoyant plan` reproduces the worked examples of the loading-budget analysis."""

from __future__ import annotations

import json

import pytest

from clairvoyant import ConfigError
from clairvoyant.cli.main import main
from clairvoyant.plan.budget import loading_budget
from clairvoyant.units import format_bytes, parse_bytes

KiB, MiB = 1024, 1024**2


def test_resnet50_on_one_v100():
    b = loading_budget(batch_size=128, step_time=0.087, sample_bytes=64 * KiB)
    assert round(b.samples_per_s_per_gpu) == 1471 and b.latency_budget_s == 0.087


def test_four_gpus_with_64k_samples():
    b = loading_budget(batch_size=128, step_time=0.087, sample_bytes=64 * KiB, gpus_per_node=4)
    assert round(b.iops) == 5885 and int(b.bytes_per_s / MiB) == 367


@pytest.mark.parametrize("experiments, iops, mib_s", [(5, 25_600, 1600), (10, 51_200, 3200)])
def test_five_to_ten_experiments(experiments, iops, mib_s):
    b = loading_budget(batch_size=256, step_time=0.2, sample_bytes=64 * KiB, gpus_per_node=4,
                       experiments=experiments)
    assert b.iops == pytest.approx(iops) and b.bytes_per_s / MiB == pytest.approx(mib_s)


def test_cache_leaves_the_misses_on_shared_storage():
    b = loading_budget(batch_size=128, step_time=0.087, sample_bytes=64 * KiB, gpus_per_node=4,
                       dataset_bytes=100 * MiB, local_capacity=50 * MiB, ram_capacity=10 * MiB)
    assert b.hit_rate == 0.5 and round(b.shared_iops) == 2943   # the RAM window is not a cache
    full = loading_budget(batch_size=1, step_time=1, sample_bytes=1, dataset_bytes=10, local_capacity=20)
    assert full.hit_rate == 1.0 and full.shared_iops == 0


@pytest.mark.parametrize("nodes, fraction", [(1, 0.5), (8, 0.5), (8, 1.0), (32, 0.25), (2, 0.25), (4, 0.1),
                                             (8, 0.05)])
def test_the_hit_rate_on_many_nodes_follows_what_each_node_has_read(nodes, fraction):
    """Per-node tiers under farthest next use (the loader's own planner) over three epochs: the budget's
    epoch-k hit rate min(f, 1 - (1 - 1/N)^k) is within a few points of the simulated one. Control: the
    old formula (f from the second epoch on) is far off on many nodes."""
    import numpy as np

    from clairvoyant.plan.budget import epoch_hit_rate
    from clairvoyant.plan.residency import simulate_epoch
    from clairvoyant.plan.sequence import node_sequence

    n, batch = 4096, 8
    sizes = np.ones(n, dtype=np.int64)
    capacity = int(fraction * n)
    seqs = [node_sequence(n, seed=1, epoch=e, world_size=nodes, ranks=range(0, 1), batch_size=batch)
            for e in range(5)]
    residents: dict = {}
    for e in range(4):
        res = simulate_epoch(seqs[e], seqs[e + 1], sizes, capacity, residents)
        residents = dict(res.residents_after.items())
        got, want = res.hits / len(seqs[e]), epoch_hit_rate(fraction, nodes, e)
        assert abs(got - want) < 0.04, (e, got, want)
        if nodes > 1 and e == 1:
            assert abs(got - fraction) > 0.04   # control: "f after the first epoch" fails the same check


def test_the_budget_reports_the_rise_on_many_nodes():
    b = loading_budget(batch_size=128, step_time=0.1, sample_bytes=100 * KiB, gpus_per_node=4, nodes=64,
                       dataset_bytes=100 * MiB, local_capacity=100 * MiB)
    assert b.hit_rate == pytest.approx(1 / 64) and b.hit_rate_limit == 1.0
    assert 250 <= b.epochs_to_limit <= 300          # 1 - (63/64)^k >= 0.99
    assert b.shared_iops == pytest.approx(b.iops * (1 - 1 / 64))


def test_cli_prints_and_speaks_json(capsys):
    args = ["plan", "--batch-size", "128", "--step-time", "0.087", "--sample-size", "64KiB", "--gpus", "4"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "1,471 samples/s" in out and "5,885 read IOPS" in out and "367.8 MiB/s" in out
    assert main(args + ["--json"]) == 0
    assert round(json.loads(capsys.readouterr().out)["iops"]) == 5885


def test_cli_measures_the_sample_size_from_a_source(dataset, capsys):
    assert main(["plan", "--batch-size", "10", "--step-time", "0.1", "--source", dataset, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert 500 < doc["sample_bytes"] < 5000 and doc["hit_rate"] == 0.0


def test_cli_needs_a_sample_size(capsys):
    assert main(["plan", "--batch-size", "1", "--step-time", "1"]) == 2
    assert "--sample-size" in capsys.readouterr().err


@pytest.mark.parametrize("text, value", [("64KiB", 65536), ("64 KB", 64000), ("1.5GiB", 1610612736),
                                         ("4096", 4096), ("2TB", 2 * 10**12)])
def test_units(text, value):
    assert parse_bytes(text) == value


def test_bad_units_and_printing():
    with pytest.raises(ConfigError, match="not a size"):
        parse_bytes("12 parsecs")
    assert format_bytes(1536) == "1.5 KiB" and format_bytes(512) == "512 B"
    assert format_bytes(367.8 * MiB) == "367.8 MiB"
