"""Lightning DDP over 2 "nodes" started by torchrun (tests/test_frameworks.py): the Loader made in
train_dataloader, each node its own local tier at 60% of the data set (CLAIRVOYANT_NODE tells the
nodes apart), all reading one emulated store. Each sample is decoded to its bytes' md5, so that
what each rank trained on can be checked. Writes LEDGER/rank{N}.json: the md5s each epoch trained
on, the store's opens per epoch, and the Loader's cluster counters."""

import hashlib
import json
import os
import sys

import lightning as L
import numpy as np
import torch

import clairvoyant
from clairvoyant.testing import EmulatedStore

DATA, WORK, LEDGER = sys.argv[1:4]
NODE = os.environ["CLAIRVOYANT_NODE"]


def md5(b: bytes) -> np.ndarray:
    return np.frombuffer(hashlib.md5(b).digest(), np.uint8).copy()


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(3, 10)
        self.seen: dict[int, list[str]] = {}
        self.opens: list[int] = []
        self.store = EmulatedStore(os.path.join(DATA, "images"), open_latency=0.0, read_latency=0.0,
                                   state_dir=os.path.join(WORK, "emu"))
        self.loader = None

    def train_dataloader(self):
        self.loader = clairvoyant.Loader(self.store, batch_size=8, local_dir=os.path.join(WORK, NODE),
                                         local_capacity="60%", seed=0, num_workers=1, decode=md5)
        return self.loader

    def on_train_epoch_start(self) -> None:
        self.trainer.strategy.barrier()
        if self.global_rank == 0:
            self.store.reset()
        self.trainer.strategy.barrier()

    def on_train_epoch_end(self) -> None:
        self.trainer.strategy.barrier()
        self.opens.append(self.store.counters().opens)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        self.seen.setdefault(self.current_epoch, []).extend(bytes(row).hex() for row in images.numpy())
        x = images.float()[:, :3] / 255
        return torch.nn.functional.cross_entropy(self.net(x), labels % 10)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    model = Model()
    trainer = L.Trainer(accelerator="cpu", devices=1, num_nodes=2, strategy="ddp", max_epochs=3, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(model)
    with open(os.path.join(LEDGER, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump({"seen": model.seen, "opens": model.opens, "cluster": model.loader.stats().get("cluster")}, f,
                  default=str)
