"""The training frameworks' own launchers (Lightning, torchrun, Accelerate), each running the
complete script that docs/user-guide.md shows, with 2 CPU processes over gloo: every sample exactly
once per epoch across the ranks, a new order each epoch, and Lightning's mid-epoch checkpoint
resumed exactly. Each script writes the labels each rank trained on; the data set's labels are
unique, so a label is a sample."""

from __future__ import annotations

import json
import os
import signal
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from clairvoyant.testing import make_dataset

pytestmark = pytest.mark.slow
GUIDE = Path(__file__).resolve().parent.parent / "docs" / "user-guide.md"
N = 640          # 10 steps of 32 per rank and epoch at 2 ranks
BIN = Path(sys.executable).parent


def guide_script(section: str) -> str:
    """The first Python block under the user guide's ``### section`` heading."""
    text = GUIDE.read_text()
    m = re.search(rf"^### {re.escape(section)}\n(.*?)^```python\n(.*?)^```", text, re.S | re.M)
    assert m, f"docs/user-guide.md has no python block under '### {section}'"
    return m.group(2)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A list file of N small images whose labels are their numbers (a label is a sample)."""
    root = tmp_path_factory.mktemp("frameworks")
    make_dataset(str(root / "images"), N, num_classes=4, size=8)
    files = sorted(p.relative_to(root) for p in (root / "images").rglob("*.jpg"))
    assert len(files) == N
    (root / "train.csv").write_text("path,label\n" + "".join(f"{p},{i}\n" for i, p in enumerate(files)))
    return root / "train.csv"


def free_port() -> str:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def run(cmd: list[str], cwd: Path, timeout: int = 100) -> None:
    """Run a training script; one that runs past ``timeout`` (under the test's own limit) is killed
    with every process it started (its ranks, their readers), so that a hang leaves nothing behind."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **NO_MPI_SHM)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    shm_before = _shm()
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise AssertionError(f"{cmd} ran past {timeout} s (killed with its processes):\n{out[-4000:]}\n{err[-6000:]}")
    assert p.returncode == 0, f"{cmd} failed ({p.returncode}):\n{out[-4000:]}\n{err[-6000:]}"
    left = _shm() - shm_before
    assert not left, f"{cmd} left shared memory behind: {sorted(left)}"


# Lightning's MPI detection imports mpi4py.MPI in every rank, which starts MPI as a singleton, and
# Open MPI's singleton leaves its shared-memory segment (/dev/shm/sm_segment.*) behind at exit. Not
# clairvoyant's (it starts MPI only under an MPI launcher): the scripts run without Open MPI's
# shared-memory transport, which a singleton has no use for (docs/user-guide.md says the same).
NO_MPI_SHM = {"OMPI_MCA_btl": "^sm"}


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def test_lightnings_mpi_detection_leaves_shared_memory_unless_told(tmp_path):
    """The control of the check in ``run``: Lightning's detection, with Open MPI's defaults, leaves
    a segment (removed here), and none with ``NO_MPI_SHM``."""
    pytest.importorskip("mpi4py")
    code = ("from lightning.fabric.plugins.environments import MPIEnvironment as M; M.detect(); "
            "import sys; assert 'mpi4py.MPI' in sys.modules")
    left = {}
    for name, extra in (("defaults", {}), ("told", NO_MPI_SHM)):
        env = {k: v for k, v in os.environ.items() if k != "OMPI_MCA_btl"}
        before = _shm()
        r = subprocess.run([sys.executable, "-c", code], env=dict(env, **extra), capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr[-3000:]
        left[name] = _shm() - before
        for n in left[name]:
            if n.startswith("sm_segment."):
                os.unlink(os.path.join("/dev/shm", n))
    assert any(n.startswith("sm_segment.") for n in left["defaults"]), left
    assert not left["told"], left


def ledger(folder: Path, ranks: int = 2) -> list[dict[int, list[int]]]:
    """Each rank's labels trained on, by epoch."""
    out = []
    for r in range(ranks):
        with open(folder / f"rank{r}.json") as f:
            out.append({int(e): v for e, v in json.load(f).items()})
    return out


def exactly_once(*parts: list[int]) -> None:
    """Every label 0..N-1 once in the parts together (a label is a sample)."""
    got = Counter(x for p in parts for x in p)
    twice = sorted(k for k, c in got.items() if c > 1)
    missing = sorted(set(range(N)) - set(got))
    assert not twice and not missing, f"{len(twice)} samples drawn twice (e.g. {twice[:5]}), " \
                                      f"{len(missing)} never (e.g. {missing[:5]})"


def check_epochs(seen: list[dict[int, list[int]]], epochs: int = 2) -> None:
    for e in range(epochs):
        exactly_once(*(s[e] for s in seen))
        assert len({len(s[e]) for s in seen}) == 1, "ranks drew different numbers of samples"
    for s in seen:
        assert s[0] != s[1], "two epochs followed the same order"


def test_the_checks_fail_on_what_the_defects_gave():
    """Negative controls: every rank drawing every sample, and a repeated epoch, are caught."""
    everything = list(range(N))
    with pytest.raises(AssertionError, match="drawn twice"):
        check_epochs([{0: everything, 1: everything[::-1]}, {0: everything, 1: everything[::-1]}])
    half = [list(range(0, N, 2)), list(range(1, N, 2))]
    with pytest.raises(AssertionError, match="same order"):
        check_epochs([{0: half[0], 1: half[0]}, {0: half[1], 1: half[1]}])
    check_epochs([{0: half[0], 1: half[0][::-1]}, {0: half[1], 1: half[1][::-1]}])   # and a good one passes


def test_lightning_ddp_draws_each_sample_once_per_epoch_and_resumes_mid_epoch(data, tmp_path):
    script = tmp_path / "train_lightning.py"
    script.write_text(guide_script("Lightning"))
    (tmp_path / "a").mkdir()
    run([sys.executable, str(script), str(data), str(tmp_path / "local"), str(tmp_path / "a"),
         "--checkpoints", str(tmp_path / "ckpt")], tmp_path)
    full = ledger(tmp_path / "a")
    check_epochs(full)

    # resume from the checkpoint of step 4 (of 10 in epoch 0) into a fresh local tier
    ckpt = tmp_path / "ckpt" / "epoch=0-step=4.ckpt"
    assert ckpt.exists(), sorted(os.listdir(tmp_path / "ckpt"))
    (tmp_path / "b").mkdir()
    run([sys.executable, str(script), str(data), str(tmp_path / "local-b"), str(tmp_path / "b"),
         "--checkpoints", str(tmp_path / "ckpt-b"), "--resume", str(ckpt)], tmp_path)
    resumed = ledger(tmp_path / "b")
    head = [s[0][:4 * 32] for s in full]   # what each rank trained on before the checkpoint
    exactly_once(*head, *(s[0] for s in resumed))
    assert [s[0] for s in resumed] == [s[0][4 * 32:] for s in full]   # the very batches it would have had
    assert [s[1] for s in resumed] == [s[1] for s in full]           # and the next epoch as before
    # control: the resumed part beside a head one batch longer counts samples twice
    with pytest.raises(AssertionError, match="drawn twice"):
        exactly_once(*[s[0][:5 * 32] for s in full], *(s[0] for s in resumed))


def test_lightning_with_a_loader_made_before_the_process_group(data, tmp_path):
    """``trainer.fit(model, train_dataloaders=loader)`` with the Loader made in the script, before
    Lightning starts the other process and the group: the Loader follows the group."""
    (tmp_path / "train_lightning.py").write_text(guide_script("Lightning"))
    (tmp_path / "main.py").write_text(f"""
import json, os, sys
import lightning as L
import clairvoyant
from train_lightning import Model
loader = clairvoyant.Loader({str(data)!r}, batch_size=32, local_dir={str(tmp_path / 'local')!r}, seed=0,
                            num_workers=2)
model = Model(None, None)
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, train_dataloaders=loader)
with open(os.path.join({str(tmp_path)!r}, f"rank{{trainer.global_rank}}.json"), "w") as f:
    json.dump(model.seen, f)
""")
    run([sys.executable, str(tmp_path / "main.py")], tmp_path)
    check_epochs(ledger(tmp_path))


_EPOCH_END = """
import json, os, sys
import lightning as L
from train_lightning import Model
model = Model(sys.argv[1], sys.argv[2])
every = L.pytorch.callbacks.ModelCheckpoint(dirpath=sys.argv[3], every_n_epochs=1, save_top_k=-1)
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=3, callbacks=[every], logger=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, ckpt_path=sys.argv[5] if len(sys.argv) > 5 else None)
with open(os.path.join(sys.argv[4], f"rank{trainer.global_rank}.json"), "w") as f:
    json.dump(model.seen, f)
"""


def test_lightning_resumes_from_an_end_of_epoch_checkpoint_with_the_next_epochs_order(data, tmp_path):
    """The default checkpoint is taken at an epoch's end; Lightning restores no loader state from
    it, calls ``iter()`` and only then ``set_epoch``: the resumed run trains epochs 1 and 2 in the
    orders the uninterrupted run had (before the pass was planned at its first batch, it repeated
    epoch 0's order)."""
    (tmp_path / "train_lightning.py").write_text(guide_script("Lightning"))
    (tmp_path / "end.py").write_text(_EPOCH_END)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    run([sys.executable, str(tmp_path / "end.py"), str(data), str(tmp_path / "local"), str(tmp_path / "ck"),
         str(tmp_path / "a")], tmp_path)
    full = ledger(tmp_path / "a")
    ckpt = tmp_path / "ck" / "epoch=0-step=10.ckpt"
    assert ckpt.exists(), sorted(os.listdir(tmp_path / "ck"))
    run([sys.executable, str(tmp_path / "end.py"), str(data), str(tmp_path / "local-b"), str(tmp_path / "ck-b"),
         str(tmp_path / "b"), str(ckpt)], tmp_path)
    resumed = ledger(tmp_path / "b")
    assert all(sorted(s) == [1, 2] for s in resumed)
    assert [s[1] for s in resumed] == [s[1] for s in full] and [s[2] for s in resumed] == [s[2] for s in full]
    assert [s[1] for s in resumed] != [s[0] for s in full]   # control: not epoch 0's order again
    for e in (1, 2):
        exactly_once(*(s[e] for s in resumed))


def test_torchrun_bare_loop(data, tmp_path):
    script = tmp_path / "train_torchrun.py"
    script.write_text(guide_script("torchrun"))
    (tmp_path / "out").mkdir()
    run([str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", free_port(), str(script), str(data),
         str(tmp_path / "local"), str(tmp_path / "out")], tmp_path)
    check_epochs(ledger(tmp_path / "out"))


@pytest.mark.skipif(shutil.which("accelerate", path=str(BIN)) is None, reason="accelerate is not installed")
def test_accelerate_launch(data, tmp_path):
    script = tmp_path / "train_accelerate.py"
    script.write_text(guide_script("Accelerate"))
    (tmp_path / "out").mkdir()
    run([str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
         "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", free_port(), str(script), str(data),
         str(tmp_path / "local"), str(tmp_path / "out")], tmp_path)
    check_epochs(ledger(tmp_path / "out"))


_ACCELERATE_CHECKPOINT = """
import json, sys
from accelerate import Accelerator
import clairvoyant
accelerator = Accelerator(cpu=True)
loader = clairvoyant.Loader(sys.argv[2], batch_size=32, local_dir=sys.argv[3], seed=0, num_workers=1)
accelerator.register_for_checkpointing(loader)
if sys.argv[1] == "save":
    it = iter(loader)
    head = [y.tolist() for _, y in (next(it) for _ in range(3))]
    accelerator.save_state(sys.argv[4])
    print(json.dumps(head + [y.tolist() for _, y in it]))
else:
    accelerator.load_state(sys.argv[4])
    print(json.dumps([y.tolist() for _, y in loader]))
"""


@pytest.mark.skipif(shutil.which("accelerate", path=str(BIN)) is None, reason="accelerate is not installed")
def test_accelerate_save_state_holds_the_loaders_position(data, tmp_path):
    script = tmp_path / "ck.py"
    script.write_text(_ACCELERATE_CHECKPOINT)
    out = []
    for step in ("save", "load"):
        p = subprocess.run([sys.executable, str(script), step, str(data), str(tmp_path / f"local-{step}"),
                            str(tmp_path / "state")], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-4000:]
        out.append(json.loads(p.stdout.strip().splitlines()[-1]))
    full, rest = out
    assert len(full) == N // 32 and rest == full[3:]   # a state not restored would give all of full


def _two_nodes(tmp_path: Path, command) -> tuple[list[str], list[dict]]:
    """A job of two "nodes" on this machine (``command(node, port)``: one launcher per node, told
    apart by CLAIRVOYANT_NODE) over 64 JPEGs: the md5s of the data set, and each rank's ledger."""
    import hashlib

    images = tmp_path / "data" / "images"
    make_dataset(str(images), 64, num_classes=4, size=8)
    truth = sorted(hashlib.md5(p.read_bytes()).hexdigest() for p in images.rglob("*.jpg"))
    (tmp_path / "work").mkdir()
    (tmp_path / "ledger").mkdir()
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **NO_MPI_SHM)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    agents = [subprocess.Popen(command(n, port), env=dict(env, CLAIRVOYANT_NODE=f"node{n}"), cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
              for n in range(2)]
    outs = []
    try:
        for a in agents:
            outs.append(a.communicate(timeout=300))
    finally:
        for a in agents:
            if a.poll() is None:
                os.killpg(a.pid, signal.SIGKILL)
                a.wait()
    assert all(a.returncode == 0 for a in agents), "\n".join(err[-4000:] for _, err in outs)
    return truth, [json.loads((tmp_path / "ledger" / f"rank{r}.json").read_text()) for r in range(2)]


def _one_cache(truth: list[str], ranks: list[dict]) -> None:
    """The store read once over the job, every epoch every sample once, peers serving over ZeroMQ."""
    print("store opens per epoch:", ranks[0]["opens"])
    assert ranks[0]["opens"] == ranks[1]["opens"] and sum(ranks[0]["opens"]) <= 1.1 * len(truth), ranks[0]["opens"]
    for e in ("0", "1", "2"):
        assert sorted(ranks[0]["seen"][e] + ranks[1]["seen"][e]) == truth, e
    assert sorted(ranks[0]["seen"]["0"] + ranks[1]["seen"]["0"][1:]) != truth   # control
    assert all("ZeroMQ" in r["cluster"]["transport"] and r["cluster"]["hits"] > 0 for r in ranks), ranks


@pytest.mark.timeout(400)
def test_lightning_on_two_nodes_under_torchrun_reads_the_store_once(tmp_path):
    """Lightning DDP, ``num_nodes=2``, one torchrun agent per "node" (CLAIRVOYANT_NODE), the Loader
    made in train_dataloader with each node's tier at 60% of the data set, 3 epochs: the nodes form
    one cache (over ZeroMQ, through torchrun's store: no MPI), the store is read once (64, 0, 0
    opens), and every epoch trains on every sample once. Control: the check of exactly-once fails
    on an epoch with a sample dropped."""
    script = Path(__file__).with_name("lightning_multinode_script.py")
    _one_cache(*_two_nodes(tmp_path, lambda n, port: [
        str(BIN / "torchrun"), "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}", str(script), "data", "work", "ledger"]))


@pytest.mark.timeout(400)
@pytest.mark.skipif(shutil.which("accelerate", path=str(BIN)) is None, reason="accelerate is not installed")
def test_accelerate_on_two_machines_reads_the_store_once(tmp_path):
    """``accelerate launch --num_machines 2`` (one process a machine, each a "node"), the Loader made
    after ``Accelerator()``, each tier at 60%, 3 epochs: one cache, the store read once, every epoch
    every sample once. Control: as above."""
    script = Path(__file__).with_name("accelerate_multinode_script.py")
    _one_cache(*_two_nodes(tmp_path, lambda n, port: [
        str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "2",
        "--machine_rank", str(n), "--main_process_ip", "127.0.0.1", "--main_process_port", str(port),
        "--mixed_precision", "no", "--dynamo_backend", "no", str(script), "data", "work", "ledger"]))
