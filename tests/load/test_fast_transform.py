"""torchvision's standard transforms carried out on uint8 a batch at a time (load/fast_transform.py):
the same draws, values within one level of torchvision's, anything unrecognized left as given.
Each check has a control."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
import torch

T = pytest.importorskip("torchvision.transforms")
from PIL import Image  # noqa: E402

from clairvoyant import Loader  # noqa: E402
from clairvoyant.errors import ClairvoyantError  # noqa: E402
from clairvoyant.load import fast_transform as ft  # noqa: E402
from clairvoyant.load.collate import default_collate  # noqa: E402

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
LEVEL = 1 / 255 / min(STD) + 1e-6   # one uint8 level, normalized


def _jpeg(h: int, w: int, mode: str = "RGB", seed: int = 0, fmt: str = "JPEG") -> bytes:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    rgb = np.stack([(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)), (xx + yy) % 256], -1)
    rgb = np.clip(rgb + rng.integers(-20, 20, rgb.shape), 0, 255).astype(np.uint8)
    img = Image.fromarray(rgb).convert(mode)
    buf = io.BytesIO()
    img.save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def _torchvision(transform, data: bytes):
    with Image.open(io.BytesIO(data)) as img:
        return transform(img.convert("RGB"))


def _geometry(transform, data: bytes) -> np.ndarray:
    """torchvision's geometric steps of ``transform`` on the PIL image: uint8 CHW."""
    steps = [t for t in transform.transforms if not isinstance(t, (T.ToTensor, T.Normalize))]
    out = _torchvision(T.Compose(steps), data)
    return np.asarray(out).transpose(2, 0, 1)


TRAIN = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
VAL = T.Compose([T.Resize(72), T.CenterCrop(64), T.ToTensor(), T.Normalize(MEAN, STD)])


@pytest.mark.parametrize("transform", [TRAIN, VAL], ids=["train", "val"])
def test_the_draws_and_the_pixels_are_torchvision_s(transform):
    """For the same generator state the fast path crops and flips where torchvision does and its
    uint8 pixels are within one level of torchvision's on PIL. Control: another state's crop
    differs by far more."""
    recipe = ft.recognize(transform)
    assert isinstance(recipe, ft.Recipe), recipe
    for k, (h, w) in enumerate([(96, 128), (120, 90), (64, 64), (110, 126)]):   # (no DCT scale: below 2x64)
        data = _jpeg(h, w, seed=k)
        torch.manual_seed(k)
        mine = ft.apply(recipe, data).numpy().astype(int)
        torch.manual_seed(k)
        theirs = _geometry(transform, data).astype(int)
        assert mine.shape == theirs.shape == (3, 64, 64)
        assert np.abs(mine - theirs).max() <= 1, (h, w, np.abs(mine - theirs).max())
        if transform is TRAIN:
            torch.manual_seed(1000 + k)   # control: another draw
            other = ft.apply(recipe, data).numpy().astype(int)
            assert np.abs(other - theirs).mean() > 5


def _packed(batch):
    """``batch`` as it comes out of a reader's slot (load/transport.py)."""
    from clairvoyant.load.transport import Output, Slot, pack, unpack_copy
    slot = Slot()
    try:
        spec, size, _ = pack(batch, slot)
        return unpack_copy(spec, slot, size, Output("numpy"))
    finally:
        slot.close()


def test_a_batch_is_converted_and_normalized_as_totensor_and_normalize_do():
    """collate_fast gives what default_collate gives of torchvision's per-sample outputs (float32,
    within a level), with the labels as they are. Control: without Normalize it is not equal."""
    datas = [_jpeg(90 + 4 * k, 110, seed=k) for k in range(6)]
    recipe = ft.recognize(TRAIN)
    torch.manual_seed(7)
    batch = _packed(ft.collate_fast(recipe, [(ft.apply(recipe, d), k) for k, d in enumerate(datas)], default_collate))
    torch.manual_seed(7)
    ref = torch.stack([_torchvision(TRAIN, d) for d in datas]).numpy()
    assert batch[0].dtype == ref.dtype == np.float32 and batch[0].shape == ref.shape
    assert np.array_equal(batch[1], np.arange(6))
    assert np.abs(batch[0] - ref).max() <= LEVEL
    plain = ft.recognize(T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor()]))
    torch.manual_seed(7)
    unnormalized = ft.finish(plain, torch.stack([ft.apply(plain, d) for d in datas])).numpy()
    assert np.abs(unnormalized - ref).max() > 0.5   # control


@pytest.mark.parametrize("mode,fmt", [("L", "JPEG"), ("CMYK", "JPEG"), ("RGB", "PNG"), ("P", "PNG")])
def test_grey_cmyk_and_other_formats_come_out_rgb_as_pil_converts_them(mode, fmt):
    """A greyscale or CMYK JPEG, a PNG, a palette PNG: RGB as PIL's convert("RGB") gives them,
    within a level. Control: the RGB original's pixels differ from the CMYK or palette one's."""
    data = _jpeg(80, 100, mode=mode, fmt=fmt, seed=3)
    recipe = ft.recognize(VAL)
    mine = ft.apply(recipe, data).numpy().astype(int)
    theirs = _geometry(VAL, data).astype(int)
    assert np.abs(mine - theirs).max() <= 1
    assert mine.shape == (3, 64, 64)


def test_a_large_image_is_decoded_at_a_dct_scale_and_stays_close():
    """A 1024x768 JPEG whose crop needs at most half its pixels is decoded smaller by libjpeg-turbo:
    the output is close to torchvision's (a different low-pass, not equal). Control: the decode
    asked for (what the path passed to simplejpeg) is below full size."""
    data = _jpeg(768, 1024, seed=5)
    transform = T.Compose([T.RandomResizedCrop(64, scale=(0.3, 1.0)), T.ToTensor()])
    recipe = ft.recognize(transform)
    asked = []
    real = ft._decode
    ft._decode = lambda d, header, need: (asked.append(need), real(d, header, need))[1]
    try:
        torch.manual_seed(2)
        mine = ft.apply(recipe, data).numpy().astype(int)
    finally:
        ft._decode = real
    torch.manual_seed(2)
    theirs = _geometry(transform, data).astype(int)
    assert 0 < asked[0][0] <= 384 and 0 < asked[0][1] <= 512, asked
    assert np.abs(mine - theirs).mean() < 4


class MyCrop(T.RandomResizedCrop):
    pass


@pytest.mark.parametrize("transform,why", [
    (T.Compose([MyCrop(64), T.ToTensor()]), "MyCrop"),
    (T.Compose([T.RandomResizedCrop(64, interpolation=T.InterpolationMode.NEAREST), T.ToTensor()]), "nearest"),
    (T.Compose([T.RandomResizedCrop(64, antialias=False), T.ToTensor()]), "antialias=False"),
    (T.Compose([T.RandomResizedCrop(64), T.Lambda(lambda x: x), T.ToTensor()]), "Lambda"),
    (T.Compose([T.RandomResizedCrop(64), T.ToTensor(), T.Lambda(lambda x: x)]), "after ToTensor"),
    (T.Compose([T.RandomResizedCrop(64)]), "no ToTensor"),
    (T.Compose([T.Resize(64), T.ToTensor()]), "depends on each image"),
    (T.RandomResizedCrop(64), "not a torchvision.transforms Compose"),
    (T.Compose([T.RandomResizedCrop(64), T.ToTensor(), T.Normalize([0.5, 0.5], [0.5, 0.5])]), "per channel"),
])
def test_what_is_not_recognized_is_left_as_given_with_its_reason(transform, why):
    got = ft.recognize(transform)
    assert isinstance(got, str) and why in got, got


@pytest.mark.parametrize("first", [False, True], ids=["pil", "to_image_first"])
def test_a_v2_pipeline_gives_what_torchvision_v2_gives(first):
    """v2's Compose (ToImage first, or after the geometry on the PIL image; ToDtype(float32,
    scale=True); Normalize): the same draws, values within a level of v2's own. Control: ToDtype
    without scale is left as given."""
    v2 = pytest.importorskip("torchvision.transforms.v2")
    geometry = [v2.RandomResizedCrop(64), v2.RandomHorizontalFlip()]
    tail = [v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    steps = [v2.ToImage(), *geometry, *tail] if first else [*geometry, v2.ToImage(), *tail]
    transform = v2.Compose(steps)
    recipe = ft.recognize(transform)
    assert isinstance(recipe, ft.Recipe), recipe
    datas = [_jpeg(90 + 5 * k, 100 + 3 * k, seed=k) for k in range(4)]
    torch.manual_seed(5)
    mine = _packed(ft.collate_fast(recipe, [(ft.apply(recipe, d), 0) for d in datas], default_collate))[0]
    torch.manual_seed(5)
    theirs = torch.stack([_torchvision(transform, d) for d in datas]).numpy()
    assert np.abs(mine - theirs).max() <= LEVEL
    unscaled = v2.Compose([*geometry, v2.ToImage(), v2.ToDtype(torch.float32)])   # control
    assert "scale=False" in ft.recognize(unscaled)


def _tree(root: str, n: int = 24) -> str:
    for k in range(n):
        d = os.path.join(root, f"c{k % 3}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"{k:03d}.jpg"), "wb") as f:
            f.write(_jpeg(70 + (k % 5) * 9, 90 + (k % 4) * 11, seed=k))
    return root


def _epoch(root: str, transform, work: str, fast: bool, **kw):
    os.environ["CLAIRVOYANT_FAST_TRANSFORM"] = "1" if fast else "0"
    try:
        with Loader(root, batch_size=8, transform=transform, local_dir=work, seed=11, num_workers=2, **kw) as ld:
            ld.set_epoch(2)
            return [(x.clone(), y.clone()) for x, y in ld], ld.stats()["transform"]
    finally:
        os.environ.pop("CLAIRVOYANT_FAST_TRANSFORM", None)


def test_the_loader_gives_what_the_transform_as_given_gives(tmp_path):
    """A Loader with the standard Compose: the fast path's batches equal (within a level) those of
    the same Loader running the transform as given, the same labels, and stats() says which path
    ran; the same epoch again gives the same crops. Control: another seed's batches differ."""
    root = _tree(str(tmp_path / "data"))
    fast, said = _epoch(root, TRAIN, str(tmp_path / "a"), True)
    slow, said_slow = _epoch(root, TRAIN, str(tmp_path / "b"), False)
    again, _ = _epoch(root, TRAIN, str(tmp_path / "c"), True)
    assert said["path"] == "fast" and said_slow["path"] == "as given"
    for (xa, ya), (xb, yb), (xc, _) in zip(fast, slow, again):
        assert torch.equal(ya, yb) and xa.shape == xb.shape and xa.dtype == xb.dtype
        assert (xa - xb).abs().max().item() <= LEVEL
        assert torch.equal(xa, xc)
    other = Loader(root, batch_size=8, transform=TRAIN, local_dir=str(tmp_path / "d"), seed=12, num_workers=2)
    with other:
        other.set_epoch(2)
        xo = next(iter(other))[0]
    assert (xo - fast[0][0]).abs().mean().item() > 0.1   # control


def test_a_corrupt_file_raises_the_same_typed_error_and_skip_skips_it(tmp_path):
    """A JPEG cut short: the fast path raises the error the transform as given raises, naming the
    sample; on_error="skip" leaves it out and yields the rest. Control: without it every sample."""
    root = _tree(str(tmp_path / "data"), 16)
    bad = os.path.join(root, "c1", "004.jpg")
    with open(bad, "r+b") as f:
        f.truncate(40)
    errors = []
    for fast in (True, False):
        with pytest.raises(ClairvoyantError) as e:
            _epoch(root, VAL, str(tmp_path / f"e{fast}"), fast)
        errors.append(e.value)
        assert "004.jpg" in str(e.value)
    assert type(errors[0]) is type(errors[1])
    got, _ = _epoch(root, VAL, str(tmp_path / "skip"), True, on_error="skip")
    assert sum(len(y) for _, y in got) == 15
    os.remove(bad)   # control
    whole, _ = _epoch(root, VAL, str(tmp_path / "whole"), True)
    assert sum(len(y) for _, y in whole) == 15


def test_device_cpu_gives_the_same_batches_converted_after_the_readers(tmp_path):
    """device="cpu": the images travel as uint8 and are converted and normalized in the training
    process: the same float32 batches as without it (the same arithmetic); stats() says where.
    An unrecognized transform with device= is moved as it is. Control: device="cuda" where there
    is no GPU is a ConfigError that says to pass None."""
    root = _tree(str(tmp_path / "data"))
    plain, _ = _epoch(root, TRAIN, str(tmp_path / "a"), True)
    moved, said = _epoch(root, TRAIN, str(tmp_path / "b"), True, device="cpu")
    assert "converted and normalized on cpu" in said["why"]
    for (xa, ya), (xb, yb) in zip(plain, moved):
        assert xb.dtype == torch.float32 and torch.equal(xa, xb) and torch.equal(ya, yb)
    other = T.Compose([T.RandomResizedCrop(64), T.Lambda(lambda x: x), T.ToTensor()])
    given, said = _epoch(root, other, str(tmp_path / "c"), True, device="cpu")
    assert said["path"] == "as given" and given[0][0].dtype == torch.float32
    if not torch.cuda.is_available():
        with pytest.raises(ClairvoyantError, match="device=None"):
            Loader(root, batch_size=8, transform=TRAIN, local_dir=str(tmp_path / "d"), device="cuda")


def test_decode_on_the_device_gives_the_readers_batches(tmp_path):
    """decode_on="device" (here device="cpu": torchvision's decode_jpeg in the training process):
    the readers send each JPEG with its draws, the batch is decoded and carried out at the
    device, and every image is within two levels of the readers' decode (no DCT scale at these
    sizes; decoders round alike within a level), the labels equal, stats() says where. A PNG among
    the JPEGs is carried out by its reader and sent as pixels. Control: the same run with the
    flip drawn but not carried out differs by far more."""
    root = _tree(str(tmp_path / "data"))
    with open(os.path.join(root, "c0", "099.png"), "wb") as f:   # (a reader decodes it; its pixels travel)
        f.write(_jpeg(80, 100, seed=99, fmt="PNG"))
    readers, said_r = _epoch(root, TRAIN, str(tmp_path / "a"), True, device="cpu")
    device, said = _epoch(root, TRAIN, str(tmp_path / "b"), True, device="cpu", decode_on="device")
    assert said["decode_on"] == "device" and "JPEGs decoded on cpu" in said["why"], said
    assert said_r["decode_on"] == "readers"
    worst = 0.0
    for (xa, ya), (xb, yb) in zip(readers, device):
        assert xb.shape == xa.shape and xb.dtype == torch.float32 and torch.equal(ya, yb)
        worst = max(worst, (xa - xb).abs().amax(dim=(1, 2, 3)).max().item())
    assert worst <= 2 * LEVEL, worst / LEVEL
    real = ft._plan_of

    def unflipped(recipe, row):   # control: the flip's draw dropped on the device's side
        return [(s, False if s.kind == "flip" else a) for s, a in real(recipe, row)]
    ft._plan_of = unflipped
    try:
        wrong, _ = _epoch(root, TRAIN, str(tmp_path / "c"), True, device="cpu", decode_on="device")
    finally:
        ft._plan_of = real
    assert max((xa - xb).abs().max().item() for (xa, _), (xb, _) in zip(readers, wrong)) > 20 * LEVEL


def test_decode_on_the_device_names_what_it_needs(tmp_path, caplog):
    """decode_on="device" without device= leaves the readers decoding, and the log says why; a bad
    value is a ConfigError naming the choices. Control: with device= the device decodes."""
    root = _tree(str(tmp_path / "data"), n=6)
    with caplog.at_level("WARNING", logger="clairvoyant"):
        with Loader(root, batch_size=2, transform=TRAIN, local_dir=str(tmp_path / "a"), decode_on="device") as ld:
            assert ld.stats()["transform"]["decode_on"] == "readers"
    assert "no device= given" in caplog.text
    with pytest.raises(ClairvoyantError, match="decode_on='gpu': choose 'readers' or 'device'"):
        Loader(root, batch_size=2, local_dir=str(tmp_path / "b"), decode_on="gpu")
    with Loader(root, batch_size=2, transform=TRAIN, local_dir=str(tmp_path / "c"), device="cpu",
                decode_on="device") as ld:   # control
        assert ld.stats()["transform"]["decode_on"] == "device"


def test_a_corrupt_jpeg_decoded_on_the_device_is_a_decode_error_naming_its_place():
    """A batch whose second JPEG's body is cut: the batched decode fails, each is decoded alone
    and the error names sample 1 of the batch and the way back to the readers' decode. Control:
    a batch of a JPEG and a PNG (its pixels from its reader) decodes."""
    recipe = ft.recognize(VAL)
    good, bad = _jpeg(80, 90, seed=1), _jpeg(80, 90, seed=2)
    bad = bad[:len(bad) // 2] + bytes(64)
    parts = [(ft.defer(recipe, d), 0) for d in (good, bad)]
    batch = ft.collate_deferred(parts, default_collate)
    with pytest.raises(ClairvoyantError, match=r"sample 1 of the batch .*decode_on='readers'"):
        ft.decode_batch(recipe, torch.device("cpu"), batch[0])
    png = _jpeg(80, 90, seed=3, fmt="PNG")
    parts = [(ft.defer(recipe, d), 0) for d in (good, png)]
    assert [p[0][1][0] for p in parts] == [ft.JPEG, ft.PIXELS]   # the PNG carried out by its reader
    out = ft.decode_batch(recipe, torch.device("cpu"), ft.collate_deferred(parts, default_collate)[0])
    assert out.shape == (2, 3, 64, 64) and out.dtype == torch.uint8   # control
    assert torch.equal(out[1], ft.apply(recipe, png))   # (VAL draws nothing: the same pixels)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none)")
def test_device_cuda_gives_the_batches_on_the_gpu(tmp_path):
    root = _tree(str(tmp_path / "data"))
    plain, _ = _epoch(root, TRAIN, str(tmp_path / "a"), True)
    moved, _ = _epoch(root, TRAIN, str(tmp_path / "b"), True, device="cuda")
    for (xa, _), (xb, _) in zip(plain, moved):
        assert xb.is_cuda and (xa - xb.cpu()).abs().max().item() <= 1e-6


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none)")
def test_decode_on_the_gpu_gives_the_readers_batches(tmp_path):
    """decode_on="device" with device="cuda": nvJPEG decodes, the GPU crops and resizes. nvJPEG fills
    in 4:2:0 colour from the nearest sample where libjpeg-turbo smooths it: up to ~10 levels apart
    at colour edges (simulated with simplejpeg's fastupsample), under half a level on average."""
    root = _tree(str(tmp_path / "data"))
    readers, _ = _epoch(root, TRAIN, str(tmp_path / "a"), True, device="cuda")
    gpu, said = _epoch(root, TRAIN, str(tmp_path / "b"), True, device="cuda", decode_on="device")
    assert said["decode_on"] == "device"
    for (xa, ya), (xb, yb) in zip(readers, gpu):
        assert xb.is_cuda and torch.equal(ya, yb.cpu() if yb.is_cuda else yb)
        diff = (xa - xb).abs()
        assert diff.max().item() <= 16 * LEVEL and diff.mean().item() <= 0.5 * LEVEL


def test_scalar_normalize_is_taken_and_a_failed_decode_leaves_the_draws_alone():
    """Normalize(0.5, 0.5) (scalars, as v1 allows) is recognized; a sample whose decode fails after
    its draws leaves the generator as it was, so the next sample's crop is the slow path's (which
    decodes before it draws). Control: the draws a successful sample makes do move it."""
    recipe = ft.recognize(T.Compose([T.RandomResizedCrop(64), T.ToTensor(), T.Normalize(0.5, 0.5)]))
    assert isinstance(recipe, ft.Recipe) and recipe.mean == (0.5,)
    bad = _jpeg(90, 90, seed=1)[:200]   # a header, then nothing
    torch.manual_seed(3)
    before = torch.get_rng_state()
    with pytest.raises(Exception):
        ft.apply(recipe, bad)
    assert torch.equal(torch.get_rng_state(), before)
    ft.apply(recipe, _jpeg(90, 90, seed=2))   # control
    assert not torch.equal(torch.get_rng_state(), before)


def test_v2_geometry_on_a_tensor_must_antialias_and_todtype_needs_toimage():
    """v2 on a tensor (after ToImage) antialiases only when told: antialias=None there runs as given;
    ToDtype with no ToImage before it (the PIL image passes through) runs as given. Control: the
    same with antialias=True is taken."""
    v2 = pytest.importorskip("torchvision.transforms.v2")
    tail = [v2.ToDtype(torch.float32, scale=True)]
    assert "antialias" in ft.recognize(v2.Compose([v2.ToImage(), v2.RandomResizedCrop(64, antialias=None), *tail]))
    assert "ToImage" in ft.recognize(v2.Compose([v2.RandomResizedCrop(64), *tail]))
    assert isinstance(ft.recognize(v2.Compose([v2.ToImage(), v2.RandomResizedCrop(64, antialias=True), *tail])),
                      ft.Recipe)


def test_array_rows_with_an_image_transform_run_it_as_given(tmp_path):
    """Rows of a .npy file (HWC uint8 images) with a v2 Compose the fast path would take for files:
    the source makes its samples itself (its decoder), so the transform is left to run as given.
    Control: the same Compose over JPEG files is taken."""
    v2 = pytest.importorskip("torchvision.transforms.v2")
    transform = v2.Compose([v2.ToImage(), v2.RandomResizedCrop(16), v2.ToDtype(torch.float32, scale=True)])
    d = tmp_path / "npy"
    d.mkdir()
    np.save(d / "a.npy", np.random.default_rng(0).integers(0, 255, (24, 20, 20, 3), dtype=np.uint8))
    with Loader(str(d), batch_size=8, transform=transform, local_dir=str(tmp_path / "l"), num_workers=1) as ld:
        said = ld.stats()["transform"]
    assert said["path"] == "as given" and "decoder" in said["why"], said
    root = _tree(str(tmp_path / "data"))   # control
    with Loader(root, batch_size=8, transform=transform, local_dir=str(tmp_path / "m"), num_workers=1) as ld:
        assert ld.stats()["transform"]["path"] == "fast"


def test_without_simplejpeg_the_readers_still_defer_jpegs(monkeypatch):
    """decode_on="device" where simplejpeg is not installed (a GPU node without it): the JPEG's size
    comes from Pillow's header read, and the reader sends the same row as with simplejpeg. Control:
    a CMYK JPEG (which the device's decoder does not take) is carried out by the reader."""
    recipe = ft.recognize(TRAIN)
    data = _jpeg(90, 120, seed=5)
    torch.manual_seed(7)
    with_sj = ft.defer(recipe, data)[1]
    monkeypatch.setattr(ft, "_simplejpeg", None)
    torch.manual_seed(7)
    without = ft.defer(recipe, data)[1]
    assert without[0] == ft.JPEG and np.array_equal(with_sj, without)
    assert ft.defer(recipe, _jpeg(90, 120, mode="CMYK", seed=6))[1][0] == ft.PIXELS   # control


def test_a_jpeg_the_device_refuses_is_decoded_on_the_host(monkeypatch):
    """decode_batch where the device's decoder refuses every JPEG (nvJPEG: arithmetic coding, 12
    bits), or gives one at another size than its header's: each is decoded on the host and the
    batch is what the device would have given. Control: the device decoding them."""
    recipe = ft.recognize(TRAIN)
    datas = [_jpeg(80 + 7 * k, 96, seed=k) for k in range(4)]
    torch.manual_seed(1)
    batch = ft.collate_deferred([(ft.defer(recipe, d), 0) for d in datas], default_collate)[0]
    want = ft.decode_batch(recipe, torch.device("cpu"), batch)   # control
    real = ft.decode_jpeg

    def refuses(data, **kw):
        raise RuntimeError("nvJPEG: unsupported JPEG")
    monkeypatch.setattr(ft, "decode_jpeg", refuses)
    assert torch.equal(ft.decode_batch(recipe, torch.device("cpu"), batch), want)

    def shrunk(data, **kw):   # another size than the header's
        got = real(data, **kw)
        return [g[:, :-1] for g in got] if isinstance(got, list) else got[:, :-1]
    monkeypatch.setattr(ft, "decode_jpeg", shrunk)
    assert torch.equal(ft.decode_batch(recipe, torch.device("cpu"), batch), want)
