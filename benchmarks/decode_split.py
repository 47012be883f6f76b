"""Benchmark: what a reader spends per sample with the JPEG decoded by the readers (the fast path's
``apply``) and with it left to the device (``decode_on="device"``: ``defer``, the header and the
draws only), and what the batched decode then costs where it runs (here the CPU: torchvision's
``decode_jpeg``; on a GPU, nvJPEG). One thread, 400 of the demo's 256x256 JPEGs, the standard
ImageNet training Compose; best of 3.

    python benchmarks/decode_split.py
"""

import torch, time, os, glob
import torchvision.transforms as T
from clairvoyant.load import fast_transform as ft
from clairvoyant.testing import make_dataset
from clairvoyant.nodeio.paths import cache_home
root = make_dataset(os.path.join(cache_home(), "demo", "synthetic-imagenet-3200"), 3200, size=256)
files = sorted(glob.glob(root + "/*/*"))[:400]
datas = [open(f, "rb").read() for f in files]
r = ft.recognize(T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize([0.485,0.456,0.406],[0.229,0.224,0.225])]))
torch.set_num_threads(1)
for name, fn in (("apply (readers decode)", ft.apply), ("defer (device decodes)", ft.defer)):
    best = 1e9
    for rep in range(3):
        t = time.perf_counter()
        for d in datas: fn(r, d)
        best = min(best, (time.perf_counter() - t) / len(datas))
    print(f"{name}: {best*1e6:.0f} us per sample")
from clairvoyant.load.collate import default_collate
parts = [(ft.defer(r, d), 0) for d in datas[:256]]
b = ft.collate_deferred(parts, default_collate)[0]
t = time.perf_counter(); out = ft.decode_batch(r, torch.device("cpu"), b); dt = time.perf_counter() - t
print(f"decode_batch on the CPU, 256 samples: {dt*1e3:.0f} ms ({dt/256*1e6:.0f} us per sample)", out.shape)
