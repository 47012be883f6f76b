"""POLICY and MECHANISM: torchvision's standard image transforms carried out on uint8, a batch at a
time (issue 40).

:func:`recognize` looks at a reader's ``transform``: a ``torchvision.transforms.Compose`` (v1)
made only of these classes, exactly (not a subclass), with these parameters, is taken:

- geometry, in order: ``RandomResizedCrop(size, scale, ratio)`` or ``Resize(int)`` then
  ``CenterCrop(size)`` (either alone too), bilinear with antialias (torchvision's default);
  ``RandomHorizontalFlip(p)`` anywhere among them;
- then ``ToTensor()``, then optionally ``Normalize(mean, std)``.

A ``torchvision.transforms.v2.Compose`` of the same classes of v2 is taken too, with
``ToImage()`` before ``ToDtype(torch.float32, scale=True)`` in place of ``ToTensor`` (its draws are
the same: v2's ``make_params`` is v1's ``get_params``, its flip draws ``torch.rand(1)``; geometry
after ``ToImage`` must antialias, as it then does on a tensor only when told; v2 scales by
``mul(1/255)``, this by ``div(255)``: a last-bit difference).
Anything else (another interpolation, ``antialias=False``, ``max_size``, a ``Lambda`` or a step of
the user's own, another order) is left to run as it is, and the reason is kept
(``stats()["transform"]``, the log). What it gives is what torchvision gives: float32 CHW in
[0, 1], normalized; the random draws are torchvision's own (its ``get_params`` and the flip's
``torch.rand(1)``, in the Compose's order, under the reader's per-sample seeding), so the crops are
the same as the slow path's and the same after a restart.

How (:func:`apply` per sample, :func:`finish` per batch): the JPEG's header gives its size
before anything is drawn; libjpeg-turbo (simplejpeg) decodes it at the smallest DCT scale that
keeps the crop at least its output size ("downsample while still compressed"), where that halves
the image at least (a scale closer to 1 saves little, and the values then differ from PIL's by
more than a rounding; at full size they are within one level of it); anything simplejpeg
declines (PNG, CMYK) is decoded by Pillow and converted to RGB as ``ImageFolder`` does; the crop
is a view; the resize is torch's uint8 bilinear with antialias (PIL's filter: equal values here);
the flip a view. Samples are collated as uint8, then the batch is converted and normalized at once
(``ToTensor`` then ``Normalize``'s arithmetic, in float32, in the same order: the same values).
"""

from __future__ import annotations

import io
import math
from typing import Any, NamedTuple

import numpy as np

from .decode import _JPEG_MAGIC, _simplejpeg   # (the default decoder's libjpeg-turbo, if installed)


class Step(NamedTuple):
    kind: str              # "rrc", "resize", "center_crop", "flip"
    size: tuple[int, int]  # (h, w) out ("resize": (short side, 0))
    args: tuple            # rrc: (scale, ratio); flip: (p,)


class Recipe(NamedTuple):
    """What the recognized Compose does: its geometric steps, then the conversion."""

    steps: tuple[Step, ...]
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None
    described: str

    def out_size(self) -> tuple[int, int] | None:
        """The (h, w) every sample comes out at, or None where it depends on the image."""
        size = None
        for s in self.steps:
            if s.kind in ("rrc", "center_crop"):
                size = s.size
            elif s.kind == "resize":
                size = None
        return size


def _pair(size: Any) -> tuple[int, int] | None:
    if isinstance(size, int):
        return (size, size)
    if isinstance(size, (list, tuple)) and len(size) in (1, 2) and all(isinstance(x, int) for x in size):
        return (size[0], size[0]) if len(size) == 1 else (int(size[0]), int(size[1]))
    return None


def _v2() -> Any:
    try:
        from torchvision.transforms import v2
        return v2
    except ImportError:   # torchvision before 0.16
        return None


def recognize(transform: Any) -> Recipe | str:
    """The recipe of ``transform``, or why it is left to run as it is (module docstring)."""
    try:
        import torch
        import torchvision.transforms as T
        from torchvision.transforms import InterpolationMode
    except ImportError:
        return "torchvision is not installed"
    if transform is None:
        return "no transform"
    v2 = _v2()
    if type(transform) is T.Compose:
        K = T
    elif v2 is not None and type(transform) is v2.Compose:
        K = v2
    else:
        return f"the transform is a {type(transform).__name__}, not a torchvision.transforms Compose (v1 or v2)"
    steps: list[Step] = []
    mean = std = None
    seen_tensor = as_image = False
    names = []
    for t in transform.transforms:
        kind = type(t)
        names.append(kind.__name__)
        if K is v2 and kind is v2.ToImage and not seen_tensor and not as_image:   # uint8 CHW: the geometry alike
            as_image = True
            continue
        if K is v2 and kind is v2.ToDtype:
            if t.dtype is not torch.float32 or not t.scale or seen_tensor:
                return f"ToDtype({t.dtype}, scale={t.scale}) is not the conversion to float32 in [0, 1]"
            if not as_image:   # (on a PIL image v2's ToDtype passes it through)
                return "ToDtype without ToImage before it leaves the PIL image as it is"
            seen_tensor = True
            continue
        if as_image and kind in (K.RandomResizedCrop, K.Resize) and t.antialias is not True:
            return f"{kind.__name__}(antialias={t.antialias}) on a tensor does not antialias"
        if seen_tensor:
            if kind is K.Normalize and mean is None:
                m, sd = (tuple(np.atleast_1d(np.asarray(v, dtype=np.float64)).tolist()) for v in (t.mean, t.std))
                if len(m) not in (1, 3) or len(sd) not in (1, 3) or any(v == 0 for v in sd):
                    return f"Normalize({t.mean}, {t.std}) is not per channel of RGB"
                mean, std = m, sd
                continue
            return f"{kind.__name__} after ToTensor is not one the fast path carries out"
        if kind is getattr(K, "ToTensor", None):
            seen_tensor = True
            continue
        mode = getattr(t, "interpolation", None)
        mode = InterpolationMode(mode) if isinstance(mode, str) and mode in ("bilinear", "nearest", "bicubic") \
            else mode   # (v2 keeps a name as given)
        if kind in (K.RandomResizedCrop, K.Resize) and (mode != InterpolationMode.BILINEAR or t.antialias is False):
            return f"{kind.__name__} with interpolation={getattr(mode, 'value', mode)}, antialias={t.antialias}"
        if kind is K.RandomResizedCrop:
            size = _pair(t.size)
            if size is None:
                return f"RandomResizedCrop(size={t.size!r})"
            steps.append(Step("rrc", size, (tuple(t.scale), tuple(t.ratio))))
        elif kind is K.Resize:
            if not isinstance(t.size, int) and not (isinstance(t.size, (list, tuple)) and len(t.size) == 1):
                return f"Resize(size={t.size!r}): only a shorter side is carried out"
            if t.max_size is not None:
                return "Resize(max_size=...)"
            steps.append(Step("resize", (t.size if isinstance(t.size, int) else t.size[0], 0), ()))
        elif kind is K.CenterCrop:
            size = _pair(t.size)
            if size is None:
                return f"CenterCrop(size={t.size!r})"
            steps.append(Step("center_crop", size, ()))
        elif kind is K.RandomHorizontalFlip:
            steps.append(Step("flip", (0, 0), (float(t.p),)))
        else:
            return f"{kind.__name__} is not one the fast path carries out (it runs as given)"
    if not seen_tensor:
        return "no ToTensor: the transform gives a PIL image"
    recipe = Recipe(tuple(steps), mean, std, " + ".join(names))
    if recipe.out_size() is None:
        return "the output's size depends on each image's (no crop of a fixed size last)"
    return recipe


def collate_fast(recipe: Recipe, samples: list, collate, uint8: bool = False) -> Any:
    """``samples`` ((uint8 image, target) each) as ``collate`` would give them after ToTensor and
    Normalize: the targets collated by it, the images converted and normalized as one batch
    (``uint8``: left uint8, for :func:`finish` on the Loader's device)."""
    from .transport import Stack
    out = collate([(0, *rest) for _, *rest in samples])
    arrays = [s[0].numpy() for s in samples]   # (views: each lands in the batch's slot once)
    images = Stack(arrays) if uint8 else Stack(arrays, np.float32, _Normalize(recipe))
    if isinstance(out, tuple):
        return (images, *out[1:])
    out[0] = images
    return out


def _decode(data: bytes, header: tuple[int, int, bool] | None, need: tuple[int, int]) -> np.ndarray:
    """``data`` as uint8 HWC RGB, decoded by libjpeg-turbo at the smallest DCT scale that keeps at
    least ``need`` (h, w) pixels (0: full size), or by Pillow."""
    if header is not None:
        try:
            if header[2]:   # grey: its one channel three times, as PIL's convert("RGB") makes it
                grey = _simplejpeg.decode_jpeg(data, colorspace="GRAY", min_height=need[0], min_width=need[1])
                return np.repeat(grey, 3, axis=2)
            return _simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=need[0], min_width=need[1])
        except ValueError:
            pass   # CMYK and the like: Pillow, as ImageFolder decodes them
    from PIL import Image
    with Image.open(io.BytesIO(data)) as img:
        return np.array(img.convert("RGB"))   # (a writable copy: torch takes it as it is)


def _header(data: bytes) -> tuple[int, int, bool] | None:
    """A JPEG's (height, width, grey), or None (not a JPEG simplejpeg reads)."""
    if _simplejpeg is None or data[:3] != _JPEG_MAGIC:
        return None
    try:
        h, w, colorspace, _ = _simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None
    if colorspace not in ("YCbCr", "Gray", "RGB"):   # CMYK, YCCK: Pillow converts them as ImageFolder does
        return None
    return int(h), int(w), colorspace == "Gray"


def _size_of(data: bytes, header: tuple[int, int, bool] | None) -> tuple[int, int]:
    if header is not None:
        return header[0], header[1]
    from PIL import Image
    with Image.open(io.BytesIO(data)) as img:
        return img.size[1], img.size[0]


def _resize(x, size: tuple[int, int]):
    import torch
    import torch.nn.functional as F
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    if x.device.type == "cpu":   # (uint8 in, uint8 out: PIL's filter, rounded alike)
        return F.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False)
    y = F.interpolate(x.float(), size=size, mode="bilinear", antialias=True, align_corners=False)
    return y.round_().clamp_(0, 255).to(torch.uint8)   # (a GPU's antialiasing resize takes float)


def _short_side(h: int, w: int, short: int) -> tuple[int, int]:
    """torchvision's Resize(int) output size: the shorter side ``short``, the other in proportion."""
    if h <= w:
        return short, int(short * w / h)
    return int(short * h / w), short


def _draws(recipe: Recipe, H: int, W: int) -> list:
    """The recipe's steps with what each drew for an image of H x W, as torchvision draws them, in
    the Compose's order: a crop's box (i, j, h, w), a flip's yes or no, a resize's size."""
    import torch
    from torchvision.transforms import RandomResizedCrop
    plan = []
    h, w = H, W
    for s in recipe.steps:
        if s.kind == "rrc":
            box = RandomResizedCrop.get_params(torch.zeros(1, 1, 1).expand(3, h, w), list(s.args[0]),
                                               list(s.args[1]))
            plan.append((s, box))
            h, w = s.size
        elif s.kind == "flip":
            plan.append((s, bool(torch.rand(1) < s.args[0])))
        elif s.kind == "resize":
            h, w = _short_side(h, w, s.size[0])
            plan.append((s, (h, w)))
        else:
            plan.append((s, None))
            h, w = s.size
    return plan


def _carry_out(x, plan: list, fy: float = 1.0, fx: float = 1.0):
    """The drawn ``plan`` on ``x`` (uint8 [1, 3, H, W], on any device), decoded at ``fy``, ``fx`` of
    the size the draws were made for (a DCT scale): uint8 [3, h, w]."""
    first = True
    for s, arg in plan:
        if s.kind == "rrc":
            i, j, ch, cw = arg
            if first and (fy != 1 or fx != 1):
                i, j = int(round(i * fy)), int(round(j * fx))
                ch, cw = max(1, int(round(ch * fy))), max(1, int(round(cw * fx)))
            x = _resize(x[..., i:i + ch, j:j + cw], s.size)
        elif s.kind == "resize":
            x = _resize(x, arg)
        elif s.kind == "center_crop":
            x = _center_crop(x, s.size)
        elif arg:   # flip
            x = x.flip(-1)
        first = False
    return x[0]


def apply(recipe: Recipe, data: bytes):
    """One sample through the recipe's geometry: a uint8 tensor [3, h, w] (its draws made as
    torchvision makes them, in the Compose's order)."""
    import torch
    header = _header(data)
    H, W = _size_of(data, header)
    # the draws first (they need only the size), so that the decode can use them
    state = torch.get_rng_state()
    plan = _draws(recipe, H, W)
    need = (0, 0)
    if plan and plan[0][0].kind == "rrc" and header is not None:   # the crop at least its output size
        (_, _, ch, cw), (oh, ow) = plan[0][1], plan[0][0].size
        need = (math.ceil(H * oh / ch), math.ceil(W * ow / cw))
    elif plan and plan[0][0].kind == "resize" and header is not None:
        need = plan[0][1]
    if need[0] * 2 > H or need[1] * 2 > W:   # a DCT scale that does not halve the image: full size
        need = (0, 0)                        # (the values then within the resize's rounding of PIL's)
    try:
        img = _decode(data, header, need)
    except Exception:   # the slow path decodes before it draws: the next samples' draws as there
        torch.set_rng_state(state)
        raise
    fy, fx = img.shape[0] / H, img.shape[1] / W   # the DCT scale (1 at full size)
    x = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).unsqueeze(0)   # channels last in memory
    return _carry_out(x, plan, fy, fx)


# -- decode on the device (decode_on="device"): the readers send the JPEG and its draws -------------

_HEAD = 5          # a deferred sample's row: kind (0 a JPEG to decode, 1 pixels), offset, length, H, W
JPEG, PIXELS = 0, 1


def defer(recipe: Recipe, data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """One sample for the device to decode: (its bytes, its row: kind, 0, length, H, W, then four
    numbers per step of what it drew). A JPEG's draws are made from its header (nothing decoded
    here); anything else (PNG, CMYK: what :func:`_header` declines) is carried out here, as
    :func:`apply` does, and its pixels sent (kind 1, H x W its output size)."""
    header = _header(data) or _pil_header(data)
    if header is None:
        x = apply(recipe, data)
        row = np.zeros(_HEAD + 4 * len(recipe.steps), np.int64)
        row[:5] = (PIXELS, 0, x.numel(), x.shape[1], x.shape[2])
        return x.contiguous().numpy().reshape(-1), row
    H, W = header[0], header[1]
    plan = _draws(recipe, H, W)
    row = np.zeros(_HEAD + 4 * len(plan), np.int64)
    row[:5] = (JPEG, 0, len(data), H, W)
    for n, (s, arg) in enumerate(plan):
        if s.kind == "rrc" or s.kind == "resize":
            row[_HEAD + 4 * n:_HEAD + 4 * n + len(arg)] = arg
        elif s.kind == "flip":
            row[_HEAD + 4 * n] = int(arg)
    return np.frombuffer(data, np.uint8), row


def _pil_header(data: bytes) -> tuple[int, int, bool] | None:
    """A JPEG's (height, width, grey) read by Pillow (nothing decoded), where simplejpeg is not
    installed; None for anything the device's decoder does not take (CMYK, not a JPEG)."""
    if _simplejpeg is not None or data[:3] != _JPEG_MAGIC:
        return None
    from PIL import Image
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.format != "JPEG" or img.mode not in ("RGB", "L"):
                return None
            return img.size[1], img.size[0], img.mode == "L"
    except Exception:   # noqa: BLE001 - the reader's own decode then names what is wrong
        return None


def collate_deferred(samples: list, collate) -> Any:
    """``samples`` ((bytes, row), target) as one batch: the targets collated by ``collate``, the
    images as ``{"deferred": bytes of all, "rows": their rows}`` (offsets filled in)."""
    out = collate([(0, *rest) for _, *rest in samples])
    rows = np.stack([s[0][1] for s in samples])
    lengths = rows[:, 2]
    rows[:, 1] = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    images = {"deferred": np.concatenate([s[0][0] for s in samples]), "rows": rows}
    if isinstance(out, tuple):
        return (images, *out[1:])
    out[0] = images
    return out


def decode_jpeg(data, **kw):
    """torchvision's ``decode_jpeg`` (deprecated from torchvision 0.29 for TorchCodec's decoders,
    which are not on PyPI for every platform yet: its warning silenced here, once per call)."""
    import warnings

    from torchvision.io import decode_jpeg as decode
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return decode(data, **kw)


def _plan_of(recipe: Recipe, row) -> list:
    plan = []
    for n, s in enumerate(recipe.steps):
        at = _HEAD + 4 * n
        if s.kind == "rrc":
            plan.append((s, tuple(int(v) for v in row[at:at + 4])))
        elif s.kind == "resize":
            plan.append((s, (int(row[at]), int(row[at + 1]))))
        elif s.kind == "flip":
            plan.append((s, bool(row[at])))
        else:
            plan.append((s, None))
    return plan


def decode_batch(recipe: Recipe, device: Any, images: dict) -> Any:
    """A deferred batch's images (:func:`collate_deferred`, on the host) decoded on ``device``
    (torchvision's ``decode_jpeg``, all of the batch's JPEGs at once: nvJPEG on a GPU) and carried
    out there as the readers would have: uint8 [B, 3, h, w] on ``device``. A JPEG the device's
    decoder refuses (nvJPEG: arithmetic coding, 12 bits, an unusual sampling) or gives at another
    size than its header's is decoded on the host instead; one that no decoder takes is a
    DecodeError naming its place in the batch."""
    import torch
    from torchvision.io import ImageReadMode
    blob, rows = images["deferred"], images["rows"]
    blob = blob if isinstance(blob, torch.Tensor) else torch.from_numpy(blob)
    rows = rows.tolist()
    jpegs = [n for n, r in enumerate(rows) if r[0] == JPEG]
    datas = [blob[rows[n][1]:rows[n][1] + rows[n][2]] for n in jpegs]
    try:
        decoded = decode_jpeg(datas, mode=ImageReadMode.RGB, device=device) if datas else []
    except RuntimeError:   # one of them: each alone
        decoded = []
        for d in datas:
            try:
                decoded.append(decode_jpeg(d, mode=ImageReadMode.RGB, device=device))
            except RuntimeError:
                decoded.append(None)
    got = dict(zip(jpegs, decoded))
    out = []
    for n, r in enumerate(rows):
        data = blob[r[1]:r[1] + r[2]]
        if r[0] == PIXELS:
            out.append(data.view(3, r[3], r[4]).to(device))
            continue
        x = got[n]
        if x is None or tuple(x.shape[-2:]) != (r[3], r[4]):
            x = _on_host(data, n, r, device)
        out.append(_carry_out(x.unsqueeze(0), _plan_of(recipe, r)))
    return torch.stack(out)


def _on_host(data: Any, n: int, row: list, device: Any) -> Any:
    """JPEG ``n`` of a batch decoded on the host (libjpeg-turbo, else Pillow), full size, on ``device``."""
    import torch
    raw = data.numpy().tobytes()
    try:
        img = _decode(raw, _header(raw), (0, 0))
    except Exception as e:   # noqa: BLE001 - named below
        from ..errors import DecodeError
        raise DecodeError(f"sample {n} of the batch (a JPEG of {row[3]}x{row[4]}) cannot be decoded on {device} "
                          f"nor here: {type(e).__name__}: {e}; pass decode_on='readers' to decode it where a bad "
                          "file is named and on_error='skip' skips it") from None
    return torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).to(device)


def _center_crop(x, size: tuple[int, int]):
    import torch.nn.functional as F
    h, w = x.shape[-2:]
    ch, cw = size
    if ch > h or cw > w:   # torchvision pads with 0 first
        pad = [(cw - w) // 2 if cw > w else 0, (cw - w + 1) // 2 if cw > w else 0,
               (ch - h) // 2 if ch > h else 0, (ch - h + 1) // 2 if ch > h else 0]
        x = F.pad(x, pad, value=0)
        h, w = x.shape[-2:]
    top, left = int(round((h - ch) / 2.0)), int(round((w - cw) / 2.0))
    return x[..., top:top + ch, left:left + cw]


class _Normalize:
    """ToTensor then Normalize's arithmetic (the same operations, in order) from uint8 into float32:
    an image where it lands in the batch's slot (``fill`` of a Stack, load/transport.py), or a
    batch on its device (:func:`finish`)."""

    def __init__(self, recipe: Recipe, device: Any = None) -> None:
        import torch
        self._torch = torch
        self.mean = self.std = None
        if recipe.mean is not None:
            self.mean = torch.tensor(recipe.mean, dtype=torch.float32, device=device).view(-1, 1, 1)
            self.std = torch.tensor(recipe.std, dtype=torch.float32, device=device).view(-1, 1, 1)

    def into(self, out: Any, images: Any) -> Any:
        out.copy_(images).div_(255)
        if self.mean is not None:
            out.sub_(self.mean).div_(self.std)
        return out

    def __call__(self, dest: np.ndarray, image: np.ndarray) -> None:
        self.into(self._torch.from_numpy(dest), self._torch.from_numpy(image))


def finish(recipe: Recipe, images: Any) -> Any:
    """A batch's uint8 images (a tensor [B, 3, h, w] on any device) as torchvision's ToTensor and
    Normalize give them: float32 [B, 3, h, w], there."""
    import torch
    out = torch.empty(images.shape, dtype=torch.float32, device=images.device)
    return _Normalize(recipe, images.device).into(out, images)
