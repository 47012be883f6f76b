"""Accelerate over 2 "nodes" (``accelerate launch --num_machines 2``, tests/test_frameworks.py): the
Loader made after ``Accelerator()``, each node its own local tier at 60% of the data set
(CLAIRVOYANT_NODE tells the nodes apart), all reading one emulated store; each sample decoded to
its bytes' md5. Writes LEDGER/rank{N}.json: the md5s each epoch trained on, the store's opens per
epoch, and the Loader's cluster counters."""

import hashlib
import json
import os
import sys

import numpy as np
import torch
from accelerate import Accelerator

import clairvoyant
from clairvoyant.testing import EmulatedStore


def md5(b: bytes) -> np.ndarray:
    return np.frombuffer(hashlib.md5(b).digest(), np.uint8).copy()


if __name__ == "__main__":
    data, work, ledger = sys.argv[1:4]
    accelerator = Accelerator(cpu=True)
    store = EmulatedStore(os.path.join(data, "images"), open_latency=0.0, read_latency=0.0,
                          state_dir=os.path.join(work, "emu"))
    loader = clairvoyant.Loader(store, batch_size=8, local_dir=os.path.join(work, os.environ["CLAIRVOYANT_NODE"]),
                                local_capacity="60%", seed=0, num_workers=1, decode=md5)
    model = torch.nn.Linear(3, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    seen: dict[int, list[str]] = {}
    opens = []
    for epoch in range(3):
        accelerator.wait_for_everyone()
        if accelerator.process_index == 0:
            store.reset()
        accelerator.wait_for_everyone()
        loader.set_epoch(epoch)
        for images, labels in loader:
            seen.setdefault(epoch, []).extend(bytes(row).hex() for row in images.numpy())
            loss = torch.nn.functional.cross_entropy(model(images.float()[:, :3] / 255), labels % 10)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
        accelerator.wait_for_everyone()
        opens.append(store.counters().opens)
    with open(os.path.join(ledger, f"rank{accelerator.process_index}.json"), "w") as f:
        json.dump({"seen": seen, "opens": opens, "cluster": loader.stats().get("cluster")}, f, default=str)
    loader.close()
    accelerator.end_training()
