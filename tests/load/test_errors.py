"""Bad input gets a typed error that names the path or sample and says what to do."""

from __future__ import annotations

import os
import shutil

import pytest

from clairvoyant import (ConfigError, DecodeError, EmptySourceError, LocalDirNotWritable, Loader,
                         ManifestError, SampleReadError, SourceNotFound)
from clairvoyant.testing.faults import FaultySource


def test_missing_path(tmp_path):
    with pytest.raises(SourceNotFound, match=r"does not exist.*check the path") as e:
        Loader(tmp_path / "nope", local_dir=tmp_path / "l")
    assert isinstance(e.value, FileNotFoundError) and "nope" in str(e.value)


def test_empty_directory(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(EmptySourceError, match="holds no files"):
        Loader(tmp_path / "empty", local_dir=tmp_path / "l")


def test_unreadable_file_names_the_sample(dataset, tmp_path, no_leaks):
    bad = "class_0002/img_0000006.jpg"
    with Loader(FaultySource(dataset, {bad}), batch_size=8, local_dir=tmp_path, num_workers=1) as ld:
        with pytest.raises(SampleReadError, match=f"{bad}.*permission denied"):
            list(ld)


def test_sample_deleted_after_indexing(tmp_path, no_leaks):
    root = tmp_path / "src"
    root.mkdir()
    for i in range(4):
        (root / f"{i}.bin").write_bytes(b"x" * 10)
    Loader(root, local_dir=tmp_path / "l").close()  # indexed
    with Loader(root, batch_size=4, local_dir=tmp_path / "l", num_workers=1, decode=bytes) as ld:
        (root / "2.bin").unlink()   # after the Loader checked the manifest against the source
        with pytest.raises(SampleReadError, match=r"'2.bin' is gone.*index --force"):
            list(ld)
    # deleted before a Loader starts, it is noticed: its folder's mtime changed (refresh.py)
    with Loader(root, batch_size=4, local_dir=tmp_path / "l", num_workers=1, decode=bytes) as ld:
        assert len(ld.manifest) == 3 and sum(len(b) for b, _ in ld) == 3


def test_local_dir_that_is_a_file(dataset, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(LocalDirNotWritable, match="local_dir"):
        Loader(dataset, local_dir=f)


def test_local_dir_of_another_user_is_refused(dataset, tmp_path):
    d = tmp_path / "theirs"
    d.mkdir()
    try:
        os.chown(d, 65534, 65534)
    except PermissionError:
        pytest.skip("changing a directory's owner needs root")
    with pytest.raises(LocalDirNotWritable, match="belongs to uid 65534"):
        Loader(dataset, local_dir=d)


def test_default_local_dir_is_private(dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    with Loader(dataset, num_workers=1) as ld:
        assert ld.store.local_dir.startswith(str(tmp_path))
        assert os.stat(ld.store.local_dir).st_mode & 0o777 == 0o700


def _write_corrupt_copy(dataset, dest, bad_key):
    shutil.copytree(dataset, dest)
    with open(os.path.join(dest, bad_key), "wb") as f:
        f.write(b"this is not a jpeg")


def test_undecodable_sample_raises_by_default(dataset, tmp_path, no_leaks):
    bad = "class_0001/img_0000005.jpg"
    _write_corrupt_copy(dataset, tmp_path / "src", bad)
    with Loader(tmp_path / "src", batch_size=8, local_dir=tmp_path / "l", num_workers=2) as ld:
        with pytest.raises(DecodeError, match=f"{bad}.*on_error='skip'"):
            list(ld)


def test_skip_reports_the_key_and_keeps_batch_counts_equal(dataset, tmp_path, no_leaks):
    bad = "class_0001/img_0000005.jpg"
    _write_corrupt_copy(dataset, tmp_path / "src", bad)
    counts, skipped, total = [], [], 0
    for rank in range(2):
        with Loader(tmp_path / "src", batch_size=8, local_dir=tmp_path / "l", num_workers=1, rank=rank,
                    world_size=2, on_error="skip") as ld:
            batches = list(ld)
            counts.append(len(batches))
            total += sum(len(y) for _, y in batches)
            skipped += ld.stats()["skipped"]
    assert counts[0] == counts[1] == 6
    assert skipped == [bad] and total == 95


@pytest.mark.parametrize("kwargs, match", [
    (dict(batch_size=0), "batch_size"), (dict(on_error="ignore"), "on_error"),
    (dict(rank=0), "both rank and world_size"), (dict(rank=3, world_size=2), "rank must be"),
    (dict(num_workers=0), "num_workers"), (dict(output="jax"), "output"), (dict(seed=-1), "seed"),
])
def test_bad_arguments(dataset, tmp_path, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        Loader(dataset, local_dir=tmp_path, **kwargs).close()


def test_corrupt_manifest(dataset, tmp_path):
    m = tmp_path / "m.json"
    m.write_text("{not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        Loader(dataset, local_dir=tmp_path / "l", manifest=str(m))


def test_non_source_object(tmp_path):
    with pytest.raises(ConfigError, match="cannot use 42 as a data source"):
        Loader(42, local_dir=tmp_path)
