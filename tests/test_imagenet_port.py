"""The README's port of pytorch/examples' ImageNet script, run as written (issue 30).

The harness below is shaped like upstream's ``imagenet/main.py`` (its arguments, its datasets and
transforms, ``--dummy``'s FakeData, its ``args.distributed`` and ``pin_memory=True``); the data
loading in the middle is the README's "after" block, cut from README.md and pasted in verbatim,
so the test fails when the README's port stops working. Real torchvision, one process and torchrun
with 2 ranks: each rank half of the data, every sample once per epoch, a new order each epoch.
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torchvision")

from clairvoyant.testing import make_dataset  # noqa: E402

from test_frameworks import BIN, free_port, run  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
N = 40   # images, each its own class: a label names its sample


def readme_port() -> str:
    """The README's "after" code block of its port of main.py."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Port a training script"):]
    after = section[section.index("\nafter "):]
    m = re.search(r"```python\n(.*?)```", after, re.S)
    assert m, "README.md: no python block after the port's 'after'"
    return m.group(1)


HEAD = '''
import argparse, json, os, sys
import torch
import torch.distributed as dist
import torch.utils.data.distributed
import torchvision.datasets as datasets
import torchvision.transforms as transforms
import clairvoyant

parser = argparse.ArgumentParser()
parser.add_argument("data", nargs="?", default="imagenet")
parser.add_argument("-j", "--workers", default=4, type=int)
parser.add_argument("--epochs", default=2, type=int)
parser.add_argument("--start-epoch", default=0, type=int)
parser.add_argument("-b", "--batch-size", default=8, type=int)
parser.add_argument("--seed", default=None, type=int)
parser.add_argument("--dummy", action="store_true")
parser.add_argument("--out", required=True)


def train(train_loader, model, criterion, optimizer, epoch, device, args):
    model.train()
    for i, (images, target) in enumerate(train_loader):
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        output = model(images)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        SEEN.setdefault(epoch, []).extend(target.tolist())
        SHAPES.add(tuple(images.shape[1:]))


def main_worker(args):
    args.distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if args.distributed:
        dist.init_process_group("gloo")
    device = torch.device("cpu")
    model = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(3, 1000))
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), 0.1)
    if args.dummy:
        train_dataset = datasets.FakeData(64, (3, 224, 224), 1000, transforms.ToTensor())
        val_dataset = datasets.FakeData(16, (3, 224, 224), 1000, transforms.ToTensor())
    else:
        traindir = os.path.join(args.data, "train")
        valdir = os.path.join(args.data, "val")
        normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
        train_dataset = datasets.ImageFolder(traindir, transforms.Compose([
            transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
            normalize]))
        val_dataset = datasets.ImageFolder(valdir, transforms.Compose([
            transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(), normalize]))
'''

TAIL = '''
        train(train_loader, model, criterion, optimizer, epoch, device, args)
    assert len(val_loader) > 0
    rank = dist.get_rank() if args.distributed else 0
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"seen": SEEN, "shapes": sorted(SHAPES), "batches": len(train_loader)}, f)
    if args.distributed:
        dist.destroy_process_group()


SEEN, SHAPES = {}, set()
if __name__ == "__main__":
    main_worker(parser.parse_args())
'''


VAL_LOADER = """
val_loader = torch.utils.data.DataLoader(
    val_dataset, batch_size=args.batch_size, shuffle=False,
    num_workers=args.workers, pin_memory=True, sampler=val_sampler)
"""


def port_script() -> str:
    """The harness with the README's block in its place ("..." there: upstream's validation loader)."""
    block = textwrap.dedent(readme_port()).replace("...\n", VAL_LOADER.lstrip("\n"))
    return HEAD + textwrap.indent(block, "    ") + TAIL


@pytest.fixture(scope="module")
def imagenet(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("imagenet")
    make_dataset(str(root / "train"), N, num_classes=N, size=40)
    make_dataset(str(root / "val"), N, num_classes=N, size=40, seed=1)
    return root


def results(out: Path, ranks: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def every_sample_once(res: list[dict], epochs: int = 2) -> None:
    for e in range(epochs):
        got = sorted(x for r in res for x in r["seen"][str(e)])
        assert got == list(range(N)), f"epoch {e}: {got}"


def launch(cmd: list[str], tmp_path: Path) -> None:
    os.environ.setdefault("TMPDIR", str(tmp_path))
    run(cmd, tmp_path, timeout=110)


@pytest.mark.timeout(150)
def test_the_readme_port_runs_in_one_process(imagenet, tmp_path):
    (tmp_path / "main.py").write_text(port_script())
    out = tmp_path / "out"
    out.mkdir()
    launch([sys.executable, str(tmp_path / "main.py"), str(imagenet), "--out", str(out)], tmp_path)
    (res,) = results(out, 1)
    every_sample_once([res])
    assert res["seen"]["0"] != res["seen"]["1"]   # a new order each epoch
    assert res["shapes"] == [[3, 224, 224]] and res["batches"] == N // 8


@pytest.mark.timeout(150)
def test_the_readme_port_under_torchrun_gives_each_rank_half(imagenet, tmp_path):
    """Control: one rank's samples alone are not the data set."""
    (tmp_path / "main.py").write_text(port_script())
    out = tmp_path / "out"
    out.mkdir()
    launch([str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", free_port(), str(tmp_path / "main.py"),
            str(imagenet), "--out", str(out)], tmp_path)
    res = results(out, 2)
    every_sample_once(res)
    for e in ("0", "1"):
        assert len(res[0]["seen"][e]) == len(res[1]["seen"][e]) == N // 2
        assert not set(res[0]["seen"][e]) & set(res[1]["seen"][e])
    assert res[0]["seen"]["0"] != res[0]["seen"]["1"]
    with pytest.raises(AssertionError):   # control
        every_sample_once(res[:1])


@pytest.mark.timeout(150)
def test_the_readme_port_with_dummy_data(tmp_path):
    """``--dummy``: torchvision's FakeData through the port, each epoch its 64 samples' labels."""
    from torchvision import datasets
    (tmp_path / "main.py").write_text(port_script())
    out = tmp_path / "out"
    out.mkdir()
    launch([sys.executable, str(tmp_path / "main.py"), "--dummy", "--out", str(out)], tmp_path)
    (res,) = results(out, 1)
    want = sorted(int(datasets.FakeData(64, (3, 224, 224), 1000)[i][1]) for i in range(64))
    for e in ("0", "1"):
        assert sorted(res["seen"][e]) == want
    assert res["shapes"] == [[3, 224, 224]]


def test_the_harness_takes_the_readme_block_verbatim():
    """The port's lines are the README's own (control: the block holds the Loader call)."""
    block = textwrap.dedent(readme_port())
    assert "clairvoyant.Loader(train_dataset" in block and "train_loader.set_epoch(epoch)" in block
    parts = [p.strip() for p in block.split("...\n")]
    assert len(parts) == 2 and all(p and textwrap.indent(p, "    ") in port_script() for p in parts)
