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
