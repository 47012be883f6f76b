"""Random state in the readers: independent across readers, ranks and epochs; the same for the same seed."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from clairvoyant import Loader, get_worker_info
from clairvoyant.load import seeding


def draws(_: bytes) -> np.ndarray:
    """An augmentation's draws from each global generator."""
    return np.array([np.random.rand(), torch.rand(1, dtype=torch.float64).item(), random.random()])


def run(dataset, local, *, seed=0, rank=0, world=1, epochs=(0,), workers=3, state=None):
    out = []
    with Loader(dataset, batch_size=8, local_dir=local, seed=seed, rank=rank, world_size=world, num_workers=workers,
                decode=draws, output="numpy", stage_threads=2) as ld:
        for e in epochs:
            ld.set_epoch(e)
            if state is not None:
                ld.load_state_dict(state)
            out.append(np.concatenate([x for x, _ in ld]))
    return out


def all_draws(dataset, tmp_path):
    return np.concatenate([d for r in range(2) for d in run(dataset, tmp_path / f"r{r}", rank=r, world=2,
                                                            epochs=(0, 1))])


def test_draws_differ_across_readers_ranks_and_epochs(dataset, tmp_path, no_leaks):
    d = all_draws(dataset, tmp_path)
    assert len(d) == 2 * 2 * 48
    for g, name in enumerate(("numpy", "torch", "random")):
        assert len(set(d[:, g].tolist())) == len(d), f"{name}: repeated draws"


def test_negative_control_unseeded_readers_repeat_numpy_and_torch_draws(dataset, tmp_path, monkeypatch, no_leaks):
    monkeypatch.setattr(seeding, "ENABLED", False)   # readers as fork leaves them (the old behaviour)
    d = all_draws(dataset, tmp_path)
    assert len(set(d[:, 0].tolist())) < len(d) / 2 and len(set(d[:, 1].tolist())) < len(d) / 2


def test_same_seed_same_draws_whatever_the_reader_count(dataset, tmp_path, no_leaks):
    a = run(dataset, tmp_path / "a", seed=5, workers=3, epochs=(0, 1))
    b = run(dataset, tmp_path / "b", seed=5, workers=1, epochs=(0, 1))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    c = run(dataset, tmp_path / "c", seed=6, workers=3, epochs=(0, 1))   # negative control
    assert not any(np.array_equal(x, y) for x, y in zip(a, c))


def test_a_resumed_epoch_draws_what_the_uninterrupted_one_drew(dataset, tmp_path, no_leaks):
    full = run(dataset, tmp_path / "a", seed=2, epochs=(1,))[0]
    with Loader(dataset, batch_size=8, local_dir=tmp_path / "b", seed=2, num_workers=2, decode=draws,
                output="numpy") as ld:
        ld.set_epoch(1)
        it = iter(ld)
        head = [next(it)[0] for _ in range(3)]
        state = json.loads(json.dumps(ld.state_dict()))
        del it
    rest = run(dataset, tmp_path / "b", seed=2, epochs=(1,), state=state)[0]
    assert np.array_equal(np.concatenate(head + [rest]), full)
    assert not np.array_equal(np.concatenate([rest] + head), full)   # control: order matters


def record_info(wid: int) -> None:
    info = get_worker_info()
    with open(f"{_INFO_DIR}/reader-{wid}.json", "w") as f:
        json.dump({"id": info.id, "n": info.num_workers, "seed": info.seed, "epoch": info.epoch,
                   "np": float(np.random.rand())}, f)


_INFO_DIR = ""


def test_worker_init_fn_sees_each_readers_info(dataset, tmp_path, no_leaks):
    global _INFO_DIR
    _INFO_DIR = str(tmp_path)
    assert get_worker_info() is None   # not in a reader
    with Loader(dataset, batch_size=8, local_dir=tmp_path / "l", seed=9, num_workers=3, worker_init_fn=record_info,
                decode=draws, output="numpy") as ld:
        ld.set_epoch(4)
        list(ld)
    infos = [json.loads((tmp_path / f"reader-{i}.json").read_text()) for i in range(3)]
    assert [i["id"] for i in infos] == [0, 1, 2] and {i["n"] for i in infos} == {3} and {i["epoch"] for i in infos} == {4}
    assert [i["seed"] for i in infos] == [seeding.reader_seed(9, 4, 0, w) for w in range(3)]
    assert len({i["np"] for i in infos}) == 3   # generators already seeded per reader when it runs


def failing_init(wid: int) -> None:
    raise RuntimeError("no GPU here")


def test_a_failing_worker_init_fn_raises_in_the_loop(dataset, tmp_path, no_leaks):
    from clairvoyant import WorkerError
    with Loader(dataset, batch_size=8, local_dir=tmp_path, num_workers=2, worker_init_fn=failing_init) as ld:
        with pytest.raises(WorkerError, match="worker_init_fn.*no GPU here"):
            list(ld)
