"""The user's own dataset and transforms: torchvision-style datasets, list files, transforms in the readers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from clairvoyant import ConfigError, Loader, SourceNotFound
from clairvoyant.load.decode import decode_image


def default_loader(path: str) -> Image.Image:   # named as torchvision's
    with open(path, "rb") as f:
        return Image.open(f).convert("RGB")


class FakeImageFolder:
    """torchvision.datasets.ImageFolder's interface, without importing torchvision."""

    def __init__(self, root, transform=None, target_transform=None, loader=default_loader):
        self.root = str(root)
        self.classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.samples = [(os.path.join(root, c, f), self.class_to_idx[c])
                        for c in self.classes for f in sorted(os.listdir(os.path.join(root, c)))]
        self.targets = [t for _, t in self.samples]
        self.transform, self.target_transform, self.loader = transform, target_transform, loader

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, target = self.samples[i]
        sample = self.loader(path)
        if self.transform is not None:
            sample = self.transform(sample)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return sample, target


class ToFloatTensor:
    """What transforms.Compose([..., ToTensor(), Normalize(...)]) ends with: a float32 CHW tensor."""

    def __call__(self, img: Image.Image) -> torch.Tensor:
        assert isinstance(img, Image.Image), f"a PIL image was expected, got {type(img)}"
        return (torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float() / 255 - 0.5) / 0.25


def times_ten(t: int) -> int:
    return t * 10


def test_an_imagefolder_is_a_source_with_its_transforms(dataset, tmp_path, no_leaks):
    ds = FakeImageFolder(dataset, transform=ToFloatTensor(), target_transform=times_ten)
    with Loader(ds, batch_size=16, local_dir=tmp_path, seed=1, num_workers=2) as ld:
        assert ld.manifest.classes == tuple(ds.classes)
        got = list(ld)
        order = [int(i) for b in ld._carry[0].batches for i in b]
    x, y = got[0]
    assert x.dtype == torch.float32 and tuple(x.shape) == (16, 3, 32, 32) and y.dtype == torch.int64
    index = {os.path.relpath(p, dataset): i for i, (p, _) in enumerate(ds.samples)}
    want = [ds[index[ld.manifest.keys[i]]] for i in order]
    assert torch.equal(torch.cat([x for x, _ in got]), torch.stack([s for s, _ in want]))
    assert torch.cat([y for _, y in got]).tolist() == [t for _, t in want]
    # negative control: without the dataset's target_transform the labels differ
    assert torch.cat([y for _, y in got]).tolist() != [t // 10 for _, t in want]


def test_a_float_batch_is_lent_from_shared_memory_not_copied(dataset, tmp_path, no_leaks):
    with Loader(FakeImageFolder(dataset, transform=ToFloatTensor()), batch_size=16, local_dir=tmp_path,
                num_workers=1) as ld:
        it = iter(ld)
        x, _ = next(it)
        assert it._run._pool.lent == 1          # the tensor views the reader's buffer
        ptr = x.untyped_storage().data_ptr()
        x2, _ = next(it)
        assert it._run._pool.lent == 2 and x2.untyped_storage().data_ptr() != ptr
        del it, x, x2


def test_a_dataset_with_its_own_loader_needs_decode(dataset, tmp_path):
    def cv2_loader(path):
        return np.zeros(1)
    with pytest.raises(ConfigError, match="cv2_loader.*decode="):
        Loader(FakeImageFolder(dataset, loader=cv2_loader), local_dir=tmp_path)
    with pytest.raises(ConfigError, match="transform is given twice"):
        Loader(FakeImageFolder(dataset, transform=ToFloatTensor()), transform=ToFloatTensor(), local_dir=tmp_path)


def test_decode_pil_hands_pil_images_and_they_collate(dataset, tmp_path, no_leaks):
    with Loader(dataset, batch_size=96, local_dir=tmp_path, shuffle=False, num_workers=1, decode="pil",
                output="numpy") as ld:
        (x, _), = list(ld)
        keys = ld.manifest.keys
    want = np.stack([decode_image(Path(dataset, k).read_bytes()) for k in keys])
    assert x.dtype == np.uint8 and np.array_equal(x, want)
    with pytest.raises(ConfigError, match="decode='jpeg'"):
        Loader(dataset, decode="jpeg", local_dir=tmp_path)


def test_a_transform_alone_gets_pil_images(dataset, tmp_path, no_leaks):
    with Loader(dataset, batch_size=8, local_dir=tmp_path, num_workers=1, transform=ToFloatTensor()) as ld:
        x, _ = next(iter(ld))
    assert x.dtype == torch.float32 and tuple(x.shape) == (8, 3, 32, 32)


def write_list(tmp_path, dataset, kind):
    keys = sorted(os.path.relpath(os.path.join(r, f), dataset) for r, _, fs in os.walk(dataset) for f in fs
                  if f.endswith(".jpg"))[:40]
    rows = [(k, "cat" if i % 3 else "dog", i / 10) for i, k in enumerate(keys)]
    path = tmp_path / f"train.{kind}"
    if kind == "csv":
        path.write_text("path,label,weight\n" + "".join(f"{k},{c},{w}\n" for k, c, w in rows))
    else:
        path.write_text("".join(json.dumps({"path": k, "label": c, "weight": w}) + "\n" for k, c, w in rows))
    return path, rows


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_a_list_file_gives_files_labels_and_fields(dataset, tmp_path, kind, no_leaks):
    from clairvoyant import list_file_source
    path, rows = write_list(tmp_path, dataset, kind)
    src = list_file_source(path, root=dataset, fields=["weight"])
    with Loader(src, batch_size=40, local_dir=tmp_path / "l", shuffle=False, num_workers=1, output="numpy") as ld:
        assert ld.manifest.classes == ("cat", "dog") and len(ld.manifest) == 40
        (x, y, f), = list(ld)
    want = sorted(rows)
    assert y.tolist() == [0 if c == "cat" else 1 for _, c, _ in want]
    assert f["weight"].tolist() == [w for _, _, w in want]
    assert x.shape == (40, 32, 32, 3)


def test_the_loader_takes_fields_of_a_list_file_path(dataset, tmp_path, no_leaks):
    """``Loader("train.csv", fields=["weight"])``: the columns travel with each sample (issue 30: the
    Loader takes fields=). Control: without fields= the batch has two elements."""
    path, rows = write_list(tmp_path, dataset, "csv")
    path.write_text("path,label,weight\n" + "".join(f"{os.path.join(dataset, k)},{c},{w}\n" for k, c, w in rows))
    with Loader(str(path), fields=["weight"], batch_size=40, local_dir=tmp_path / "l", shuffle=False,
                num_workers=1, output="numpy") as ld:
        (x, y, f), = list(ld)
    assert f["weight"].tolist() == [w for _, _, w in sorted(rows)] and x.shape == (40, 32, 32, 3)
    with Loader(str(path), batch_size=40, local_dir=tmp_path / "l2", shuffle=False, num_workers=1,
                output="numpy") as ld:
        assert len(next(iter(ld))) == 2


def test_a_list_file_path_is_a_source_and_bad_lists_say_what_is_wrong(dataset, tmp_path, no_leaks):
    keys = sorted(os.path.relpath(os.path.join(r, f), dataset) for r, _, fs in os.walk(dataset) for f in fs
                  if f.endswith(".jpg"))[:10]
    lst = tmp_path / "list.csv"
    lst.write_text("".join(f"{os.path.join(dataset, k)},{i % 2}\n" for i, k in enumerate(keys)))   # no header
    with Loader(lst, batch_size=10, local_dir=tmp_path / "l", shuffle=False, num_workers=1, output="numpy") as ld:
        (x, y), = list(ld)
        assert y.tolist() == [i % 2 for i in range(10)] and x.shape[0] == 10
    lst.write_text(f"{os.path.join(dataset, keys[0])},0\n{os.path.join(dataset, 'nope.jpg')},1\n")
    with pytest.raises(SourceNotFound, match="nope.jpg"):
        Loader(lst, local_dir=tmp_path / "l", reindex=True)
    lst.write_text(f"{os.path.join(dataset, keys[0])},0\n{os.path.join(dataset, keys[0])},1\n")
    with pytest.raises(ConfigError, match="more than once"):
        Loader(lst, local_dir=tmp_path / "l")
    (tmp_path / "bad.jsonl").write_text('{"path": "a.jpg"}\nnot json\n')
    with pytest.raises(ConfigError, match="line 2"):
        Loader(tmp_path / "bad.jsonl", local_dir=tmp_path / "l")
