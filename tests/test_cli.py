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
