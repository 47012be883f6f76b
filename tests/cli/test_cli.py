"""The command line: index, and the demo at a tiny size so that it does not rot."""

from __future__ import annotations

import json
import os

from clairvoyant.cli.main import main


def test_index_builds_once_then_reuses(dataset, tmp_path, capsys):
    out = str(tmp_path / "m.json")
    assert main(["index", dataset, "-o", out, "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["built"] and first["samples"] == 96 and first["classes"] == 4
    assert main(["index", dataset, "-o", out, "--json"]) == 0
    assert not json.loads(capsys.readouterr().out)["built"]
    assert main(["index", dataset, "-o", out, "--json", "--force"]) == 0
    assert json.loads(capsys.readouterr().out)["built"]


def test_index_error_is_one_clear_line(tmp_path, capsys):
    assert main(["index", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("clairvoyant: error:") and "does not exist" in err


def test_demo_runs_at_a_tiny_size(tmp_path, capsys, no_leaks):
    out = tmp_path / "out"
    rc = main(["demo", "--batches", "3", "--batch-size", "8", "--workers", "1,2", "--stage-threads", "4",
               "--open-latency-ms", "1", "--read-latency-ms", "0", "--repeats", "2", "--data-dir", str(tmp_path / "data"),
               "--out", str(out), "--json"])
    assert rc == 0
    summary = json.loads((out / "staging.json").read_text())
    names = [r["name"] for r in summary["rows"]]
    assert names[:2] == ["a1", "a2"] and "c" in names and "d" in names and "d2" in names
    assert all(r["images_per_s"] > 0 for r in summary["rows"])
    assert summary["targets"]["second_epoch_source_bytes"] == 0
    assert len(summary["repeats"]["d_images_per_s"]) == 2
    assert os.path.getsize(out / "staging.png") > 10_000
    assert json.loads(capsys.readouterr().out)["targets"]["d_first_batch_s"] > 0


def test_demo_local_capacity_compares_with_the_optimum_and_lru(tmp_path, capsys, no_leaks):
    out = tmp_path / "out"
    rc = main(["demo", "--local-capacity", "50%", "--images", "96", "--epochs", "2",
               "--data-dir", str(tmp_path / "data"), "--out", str(out), "--json"])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    later = [r for r in rows if r["epoch"] == 1]
    assert {r["ranks"] for r in later} == {1, 4}
    # one rank follows the plan exactly; at this toy size (2 batches per rank and epoch) four ranks
    # drift across epoch boundaries by a large share of an epoch, so a few keeps come late: the
    # 1-point target is a benchmark figure at a realistic size (docs/benchmarks.md)
    one, four = sorted(later, key=lambda r: r["ranks"])
    assert abs(one["hit_rate"] - one["optimum"]) <= 0.01 and one["lru"] < one["optimum"], one
    assert abs(four["hit_rate"] - four["optimum"]) <= 0.10 and four["lru"] < four["hit_rate"], four
    assert os.path.getsize(out / "caching.png") > 10_000
    assert main(["demo", "--local-capacity", "half"]) == 2


def test_cache_verify_and_clear(dataset, tmp_path, capsys, no_leaks):
    from clairvoyant import Loader
    with Loader(dataset, batch_size=16, local_dir=tmp_path / "l", num_workers=1) as ld:
        list(ld)
        assert main(["cache", "clear", str(tmp_path / "l")]) == 2          # refused while in use
        victim = ld.store.find(ld.manifest.keys[0])
    capsys.readouterr()
    assert main(["cache", "verify", str(tmp_path / "l")]) == 0
    assert "consistent: 96 entries" in capsys.readouterr().out
    with open(victim.path, "r+b") as f:
        f.seek(victim.offset)
        f.write(b"\0")
    assert main(["cache", "verify", str(tmp_path / "l")]) == 1
    assert "corrupt" in capsys.readouterr().out
    assert main(["cache", "clear", str(tmp_path / "l"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"removed": 96}
    assert main(["cache", "verify", str(tmp_path / "l"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["entries"] == 0
    assert main(["cache", "verify", str(tmp_path / "nothing")]) == 2
