"""The Loader: what the training loop holds.

It lists the source once (persisted manifest), plans each epoch's order as a
pure function of (seed, epoch, rank), stages upcoming samples to node-local
storage while reader processes decode the already-staged ones, and yields
batches in plan order. PyTorch conventions: ``len``, ``set_epoch``,
``state_dict`` / ``load_state_dict``, ``shuffle``, ``drop_last``.
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import Any, Callable, Iterator

import numpy as np

from .. import manifest as manifest_mod
from ..cache.entry import entry_size, unseal
from ..cache.extents import read_entry
from ..cache.node import open_tiers, residents
from ..stage.gate import NodeProgress
from ..cache.tiers import Tiers
from ..dist import cluster as cluster_mod
from ..dist.cluster import Cluster
from ..dist.topology import (digest63, gather_over_group, local_from_env, node_name, nodes_of, process_group,
                             resolve, validate)
from ..errors import ConfigError, CorruptEntry, EmptySourceError
from ..plan import num_batches, position_after
from ..plan.layout import NodeLayout
from ..plan.ranges import Ranges
from ..plan.rank_plan import ClusterTiers, PlanConfig, RankEpochPlan, plan_rank_epoch
from ..source import DatasetPort, as_source, is_dataset
from ..stage.engine import RangeReader
from ..tune.autotune import ReaderTuner, Tuner
from ..tune.metrics import MetricsLog, stage_rates
from ..tune.spike import SpikeRule
from ..tune.stats import Stats
from ..tune.verdict import judge
from .decode import resolve as resolve_decode
from .guard import Guard
from .options import RunOptions
from .pipeline import EpochRun
from .transport import Output
from .worker import ReaderSpec

STATE_FORMAT = "clairvoyant-loader-state"
log = logging.getLogger("clairvoyant")
PEER_WAIT = 2.0   # seconds
AUTO_START_THREADS = 48
RANGE_START_THREADS = 8   # where the plan reads ranges whole (measured: docs/benchmarks.md, issue 22)


def _default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


class Loader:
    """Iterate over batches of a source, staging upcoming samples to node-local storage.

    Args:
        source: a directory path; a list file (``.csv``/``.tsv``/``.jsonl``: path, label[, more]); a
            torchvision-style dataset (``ImageFolder(root, transform=t)``: its files, classes, transform
            and target_transform are used as they are); or a source object (e.g.
            ``clairvoyant.testing.EmulatedStore``, ``clairvoyant.ListedSource``); or an object store
            URL (``s3://bucket/prefix``, ``gs://...``, ``https://...``: docs/object-stores.md).
        storage_options: with a URL source, the fsspec file system's options (credentials, endpoint_url).
        batch_size: samples per batch on this rank.
        local_dir: node-local staging directory, shared by the ranks of a node; defaults to a
            per-user directory under ``$TMPDIR`` created with mode 0700.
        local_capacity: bytes the local tier may hold (``"400GiB"``, ``4e11``, or ``"50%"`` of the
            data set); default 90% of the device's free space. Samples needed farthest in the future
            are the ones not kept (Belady's MIN over the node's known order).
        ram_capacity: bytes of the RAM tier (the window of samples needed soonest, in ``ram_dir``,
            default /dev/shm); default a quarter of available memory.
        local_world_size: ranks on this node, which share both tiers (default from the launcher).
        balance: schedule the node's staging by deadline across its ranks: no rank's staging runs more
            than a few batches ahead of the slowest rank's, so the shared storage serves the rank furthest
            behind first.
        verdict: log, at the end of each epoch, whether loading kept the loop fed and, if not, the
            bottleneck stage (logger ``clairvoyant``, level INFO; also in ``stats()["verdict"]``).
        metrics: a path: append JSON lines there, one per batch (wait, loop step, wait by cause) and
            one per epoch (verdict, tiers); ``clairvoyant report PATH`` draws them.
        seed, shuffle, drop_last: as PyTorch's DistributedSampler and DataLoader.
        decode: what a sample's bytes become: ``"numpy"`` (uint8 HWC RGB, libjpeg-turbo for JPEG),
            ``"pil"`` (an RGB PIL image, as torchvision's loader gives) or a callable; default
            ``"pil"`` when there is a transform, else ``"numpy"``.
        transform, target_transform: applied in the reader to each decoded sample and to its label,
            as torchvision's datasets apply them (e.g. a ``transforms.Compose`` written for
            ImageFolder).
        worker_init_fn: called with the reader's index at the start of each reader process, after its
            generators are seeded; ``clairvoyant.get_worker_info()`` tells the reader's id, count and
            seed there. Readers reseed Python's, NumPy's and torch's global generators before every
            batch from (seed, epoch, rank, the batch's position), so augmentations differ across
            readers, ranks and epochs and repeat for the same seed (load/seeding.py).
        collate_fn: list of ``(sample, label)`` to a batch (default: stack arrays, labels to int64).
        num_workers: reader processes, or None (the default): one per CPU this process may use and
            one more, then tuned once per epoch (one more while readers hold the loop back and it
            helps, up to two per CPU; tune/autotune.py).
        stage_threads: I/O threads reading from the source, or ``"auto"`` (the default): the tuner
            moves the count every half second from what it measures (more when the loop waits on
            the source and the threads are busy, fewer when they idle; tune/autotune.py).
        lookahead: how many batches ahead of the training loop staging runs.
        prefetch: batches each reader may hold ready.
        rank, world_size: default from the ``torch.distributed`` process group when one is initialised
            (Lightning, Accelerate, torchrun; also when it is initialised after the Loader was made,
            before the first iteration), else from torchrun, MPI or SLURM variables, else a single
            process. Launcher variables that disagree with the process group are a ``ConfigError``.
        on_error: ``"raise"`` (default) or ``"skip"`` samples that cannot be read or decoded.
        manifest: path of the persisted manifest (default: under the per-user cache).
        reindex: walk the source again even if a manifest exists.
        output: ``"auto"`` (torch tensors if PyTorch is installed), ``"torch"`` or ``"numpy"``.
        pin_memory: copy batches into page-locked memory (when CUDA is available).
    """

    def __init__(self, source: Any, batch_size: int = 1, *, local_dir: str | os.PathLike[str] | None = None,
                 seed: int = 0, shuffle: bool = True, drop_last: bool = False,
                 decode: Callable[[bytes], Any] | None = None, collate_fn: Callable | None = None,
                 num_workers: int | None = None, stage_threads: int | str = "auto", lookahead: int = 64,
                 prefetch: int = 2, rank: int | None = None, world_size: int | None = None,
                 on_error: str = "raise", manifest: str | None = None, reindex: bool = False,
                 output: str = "auto", pin_memory: bool = False, mp_context: str = "fork",
                 local_capacity: int | str | None = None, ram_capacity: int | str | None = None,
                 ram_dir: str | os.PathLike[str] | None = None, local_world_size: int | None = None,
                 balance: bool = True, verdict: bool = False, metrics: str | os.PathLike[str] | None = None,
                 transform: Callable | None = None, target_transform: Callable | None = None,
                 worker_init_fn: Callable[[int], None] | None = None, cluster: bool | str = "auto",
                 storage_options: dict | None = None) -> None:
        if isinstance(stage_threads, str) and stage_threads == "auto":
            self._tuner: Tuner | None = Tuner(AUTO_START_THREADS)
            stage_threads = AUTO_START_THREADS
        else:
            self._tuner = None
        for name, value, low in (("batch_size", batch_size, 1), ("stage_threads", stage_threads, 1),
                                 ("lookahead", lookahead, 1), ("prefetch", prefetch, 1), ("seed", seed, 0)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
                also = " or 'auto'" if name == "stage_threads" else ""
                raise ConfigError(f"{name} must be an integer >= {low}{also}, got {value!r}")
        if num_workers is not None and (not isinstance(num_workers, int) or num_workers < 1):
            raise ConfigError(f"num_workers must be an integer >= 1 or None, got {num_workers!r}")
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error={on_error!r}: choose 'raise' or 'skip'")
        for name, fn in (("transform", transform), ("target_transform", target_transform),
                         ("worker_init_fn", worker_init_fn)):
            if fn is not None and not callable(fn):
                raise ConfigError(f"{name}={fn!r} is not callable")
        port = DatasetPort(source) if is_dataset(source) else None
        if port is not None:   # a torchvision-style dataset: its files, labels and transforms
            for name, mine, theirs in (("transform", transform, port.transform),
                                       ("target_transform", target_transform, port.target_transform)):
                if mine is not None and theirs is not None:
                    raise ConfigError(f"{name} is given twice, to the Loader and to dataset {port.name}: "
                                      "pass it once")
            transform = transform if transform is not None else port.transform
            target_transform = target_transform if target_transform is not None else port.target_transform
            if not port.pil and decode is None:
                raise ConfigError(
                    f"dataset {port.name} opens its files with its own loader ({port.loader_name}), which "
                    "clairvoyant cannot call on staged bytes: pass decode= a function from a file's bytes to "
                    "what that loader returns")
            source = port.source
        self.decode = resolve_decode(decode, has_transform=transform is not None)
        self.transform, self.target_transform, self.worker_init_fn = transform, target_transform, worker_init_fn
        if (rank is None) != (world_size is None):
            raise ConfigError("pass both rank and world_size, or neither (then they come from the launcher)")
        self._local_world_size = None if local_world_size is None else int(local_world_size)
        self._topology_given = rank is not None
        self._agreed = False   # the ranks of a process group compared manifests and node names
        if rank is None:   # the process group if there is one, else the launcher's variables
            self.topology = self._place()
        else:
            lws = int(local_world_size or 1)
            self.topology = validate(int(rank), int(world_size), local_world_size=lws)
        self.source = as_source(source, storage_options)
        self.manifest, self.indexed = manifest_mod.obtain(self.source, manifest, reindex=reindex)
        self.source.use_manifest(self.manifest)   # an object store reads exactly the listed sizes
        if len(self.manifest) == 0:
            raise EmptySourceError(f"data source {self.source.uri} holds no samples: check the path")
        self._cluster: Cluster | None = None
        if cluster_mod.wanted(cluster):   # the job's nodes as one cache, over MPI (dist/cluster.py)
            self._cluster = Cluster(plan_fingerprint=cluster_mod.fingerprint(
                manifest=self.manifest.fingerprint, seed=int(seed), batch_size=int(batch_size),
                shuffle=bool(shuffle), drop_last=bool(drop_last)))
            t, c = self.topology, self._cluster
            if (c.rank, c.world_size) != (t.rank, t.world_size):
                raise ConfigError(f"MPI says rank {c.rank} of {c.world_size} but the loader has rank {t.rank} "
                                  f"of {t.world_size}: pass the MPI rank and size, or cluster=False")
            self.topology = c.layout
        self._output = Output(output, pin_memory)   # checked before anything is set up on disk
        sizes = np.asarray(self.manifest.sizes)
        # what tiers count, per sample; int32 where every entry fits (14.2 M samples: 57 MB, not 114)
        small = len(sizes) == 0 or int(sizes.max()) + entry_size(0) < 2**31
        self._entry_sizes = sizes.astype(np.int32 if small else np.int64) + np.int32(entry_size(0))
        self.tiers = self._open_tiers(local_dir, ram_dir, local_capacity, ram_capacity)
        if self._cluster is not None:
            self._cluster.start(self.tiers.local_capacity, self._serve)
        # leaves the node's tiers (the last one out empties the RAM tier) on close, GC or exit
        self._close_tiers = weakref.finalize(self, _close_tiers, self.tiers)
        self._balance = bool(balance)
        self._progress: NodeProgress | None = None   # deadline scheduling across the node's ranks
        self._open_progress()
        self.store = self.tiers.local
        self.batch_size, self.seed, self.shuffle, self.drop_last = int(batch_size), int(seed), shuffle, drop_last
        self._config = PlanConfig(len(self.manifest), self.batch_size, self.seed, bool(shuffle), bool(drop_last))
        self.collate_fn = collate_fn
        self._reader_tuner = ReaderTuner(_default_workers()) if num_workers is None else None
        self.num_workers = num_workers or self._reader_tuner.readers
        self._epochs_seen = 0
        self.stage_threads, self.lookahead, self.prefetch = stage_threads, lookahead, prefetch
        self.on_error, self.mp_context = on_error, mp_context
        self._stats = Stats()
        self._verdict_log = bool(verdict)
        self._last_verdict: dict | None = None
        self._metrics = MetricsLog(os.fspath(metrics)) if metrics is not None else None
        self._carry: tuple[RankEpochPlan, EpochRun] | None = None   # the last epoch's plan and its run
        self._inventory_used = False
        self._epoch = 0
        self._passed = False      # the current epoch's pass reached its end: the next iteration moves on
        self._deferred: int | None = None   # set_epoch during a pass: for the next one
        self._broken: int | None = None   # the epoch of a pass closed before its end
        self._resume = 0          # global position of the epoch to start the next iteration at
        self._start = 0           # global position the current iteration started at
        self._span = 0            # batches of the current iteration
        self._done = 0            # batches of the current iteration already yielded (for state_dict)
        self._loaded_epoch: int | None = None
        self._active: weakref.ReferenceType[_EpochIterator] | None = None
        self._guard: Guard | None = None   # the loss-spike guard, once guard() was called
        self._ranges: RangeReader | bool | None = None   # see _range_reader (False: none)

    def _open_tiers(self, local_dir, ram_dir, local_capacity, ram_capacity) -> Tiers:
        node = open_tiers(self.source, self._entry_sizes, local_dir=local_dir, local_capacity=local_capacity,
                          ram_dir=ram_dir, ram_capacity=ram_capacity, direct=self._direct)
        self.capacities = {"local": node.local, "ram": node.ram}
        log.info("clairvoyant: local tier %s holds up to %s; RAM tier %s up to %s", node.tiers.local.root,
                 node.local, node.tiers.ram.root, node.ram)
        return node.tiers

    def _direct(self, local_capacity: int) -> bool:
        """A miss to keep goes straight to the local tier when everything fits, or when this process
        is the node's only rank (no other rank's keeps to make room for)."""
        return local_capacity >= int(self._entry_sizes.sum()) or self.topology.local_world_size == 1

    def _open_progress(self) -> None:
        """The node-wide deadline gate of ``balance=True``, for the current topology."""
        if self._progress is not None:
            self._progress.close()
            self._progress = None
        t = self.topology
        if self._balance and t.local_world_size > 1:
            self._progress = NodeProgress(self.tiers.local.root, t.local_rank, t.local_world_size)

    # -- where this process sits ------------------------------------------------------------------

    def _place(self) -> NodeLayout:
        """Rank, world size and node layout when none were given (dist/topology.py); a
        ``local_world_size=`` argument overrides the node layout."""
        lws = self._local_world_size
        t = resolve()
        return t if lws is None else validate(t.rank, t.world_size, local_world_size=lws, origin=t.origin)

    def _follows_group(self) -> bool:
        """A process group is there and its ranks have not compared notes yet (also one started
        after this Loader was made: Lightning's DDP starts it in ``Trainer.fit``)."""
        return not self._topology_given and self._cluster is None and not self._agreed and process_group() is not None

    def _where(self) -> NodeLayout:
        """The topology, as the process group says now (no collective call)."""
        return self._place() if self._follows_group() else self.topology

    def _bind(self) -> None:
        """Before the first pass under a process group (every rank iterates: a collective call is
        safe here, never in the constructor): take the group's rank and world size, and exchange
        once, over the group, each rank's node name and manifest. Ranks whose manifests differ
        (the source changed while they started, each checking it on its own) stop with an error
        instead of drawing samples twice or never; the node layout comes from the names where no
        variable gives it."""
        if not self._follows_group():
            return
        old, t = self.topology, self._place()
        rows = gather_over_group([digest63(node_name().encode()), len(self.manifest),
                                  digest63(self.manifest.fingerprint.encode())])
        mine = rows[t.rank][1:]
        differ = [r for r, row in enumerate(rows) if row[1:] != mine]
        if differ:
            raise ConfigError(
                f"the ranks do not agree on the data set {self.source.uri}: rank {t.rank} lists {mine[0]} samples, "
                f"ranks {differ} list {sorted({rows[r][1] for r in differ})} (or other files): the source changed "
                "while the job started. Run `clairvoyant index SRC` once before the job, then start it again")
        if self._local_world_size is None and local_from_env(os.environ, t.rank, t.world_size) is None:
            t = NodeLayout(nodes_of([row[0] for row in rows]), t.rank, t.origin)
        self._agreed, self.topology = True, t
        if t == old:
            return
        log.info("clairvoyant: rank %d of %d (node of %d ranks) from torch.distributed (it had rank %d of %d, "
                 "node of %d, from %s)", t.rank, t.world_size, t.local_world_size, old.rank, old.world_size,
                 old.local_world_size, old.origin)
        if self._carry is not None:   # an epoch planned for the old layout: nothing of it carries over
            self._carry[1].close()
            self._carry = None
        self.tiers.direct = self._direct(self.tiers.local_capacity)
        self._open_progress()

    def _residents(self) -> dict[int, int]:
        """Samples in the local tier now (the session's inventory the first time, so that all ranks of
        the node start from the same picture), as manifest index -> entry bytes."""
        entries = self.tiers.inventory if not self._inventory_used else self.tiers.local.entries()
        self._inventory_used = True
        return residents(self.manifest, entries, self._entry_sizes)

    def _plan(self, position: int) -> RankEpochPlan:
        """This rank's plan of the current epoch from global ``position`` on (plan/rank_plan.py),
        starting from what the last epoch's plan left in the local tier if that epoch ran to its
        end, else from what the tier holds now."""
        c = self._cluster
        last = self._carry
        carried = last is not None and last[0].epoch == self._epoch - 1 and position == 0 and last[1].completed
        spec = None
        if c is not None:   # every node's residents: carried over where every rank can, else exchanged
            carried = c.all_true(carried)   # (collective calls, taken alike by every rank)
            held = last[0].cluster_residents if carried else c.residents(self._residents())
            spec = ClusterTiers(c.layout, c.capacities, tuple(held))
        residents = last[0].residents_after if carried else ({} if c is not None else self._residents())
        reader = self._range_reader() if spec is None else None
        return plan_rank_epoch(self._entry_sizes, self._config, self.topology, epoch=self._epoch,
                               capacity=self.tiers.local_capacity, residents=residents, position=position,
                               cluster=spec, ranges=None if reader is None else reader.ranges)

    def _range_reader(self) -> RangeReader | None:
        """A source that packs samples together, read a range at a time where the plan says it pays
        (plan/ranges.py): only where the local tier holds the data set (the plan checks) and no
        cluster cache serves samples from peers. Worked out once."""
        if self._ranges is None:
            self._ranges = False
            if self._cluster is None and self.tiers.local_capacity >= int(self._entry_sizes.sum()):
                found = self.source.sample_ranges(self.manifest.keys)
                if found is not None:
                    self._ranges = RangeReader(Ranges(of=found[0], nbytes=found[1]), self.source.read_range)
        return self._ranges or None

    def _serve(self, index: int) -> bytes | None:
        """A peer asks for sample ``index``: its bytes if this node's local tier holds a sound entry."""
        key, size = self.manifest.keys[index], int(self.manifest.sizes[index])
        loc = self.tiers.find_local(key, size)
        if loc is None:
            return None
        try:
            data = unseal(read_entry(loc), size, f"{loc.path}@{loc.offset}")
        except (FileNotFoundError, CorruptEntry):
            return None
        carry = self._carry
        if carry is not None:
            carry[1].peer_served(index)
        return data

    # -- PyTorch conventions --------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self._where().rank

    @property
    def world_size(self) -> int:
        return self._where().world_size

    @property
    def sampler(self) -> "EpochSetter":
        """For frameworks that call ``loader.sampler.set_epoch(e)`` (Lightning does, on every epoch):
        it calls ``set_epoch`` here."""
        return EpochSetter(self)

    batch_sampler = None   # as a DataLoader with a sampler has it; frameworks look for both

    def __len__(self) -> int:
        per_rank = -(-len(self.manifest) // self.world_size)
        return num_batches(per_rank, self.batch_size, self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next iteration follows. Optional: without it, each
        iteration after a complete pass moves to the next epoch."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ConfigError(f"epoch must be a non-negative integer, got {epoch!r}")
        if self._in_pass():   # as a sampler's: the pass under way keeps its order
            self._deferred = int(epoch)
            return
        self._deferred = None
        self._select(int(epoch))

    def _select(self, epoch: int) -> None:
        self._passed, self._broken = False, None
        if epoch != self._loaded_epoch:  # keep a resume position loaded for this very epoch
            self._resume = 0
            self._loaded_epoch = None
        if epoch != self._epoch:
            self._done = self._start = self._span = 0
        self._epoch = int(epoch)

    def __iter__(self) -> Iterator[Any]:
        """One pass over the rest of the current epoch. After a pass that reached the epoch's end,
        the next iteration is the next epoch's (as a re-shuffling DataLoader draws a new order each
        pass) unless ``set_epoch`` was called in between. The pass is planned at its first batch,
        so a ``set_epoch`` between ``iter()`` and the first ``next()`` still counts (Lightning
        calls them in that order)."""
        self._close_active()
        it = _EpochIterator(self)
        self._active = weakref.ref(it)
        return it

    def _in_pass(self) -> bool:
        """A pass has yielded batches and not reached its end: ``set_epoch`` waits for the next one."""
        it = self._active() if self._active is not None else None
        return it is not None and it.started and not it.finished and self._done > 0 and not self._passed

    def _settle_epoch(self) -> None:
        """Apply a ``set_epoch`` that came while a pass was under way, once it is not."""
        if self._deferred is not None and not self._in_pass():
            epoch, self._deferred = self._deferred, None
            self._select(epoch)

    def _begin(self) -> EpochRun:
        """Plan the pass and start its run: at the first ``next()`` of an iterator."""
        self._bind()
        self._settle_epoch()
        if self._passed:
            self._epoch, self._resume, self._loaded_epoch, self._passed = self._epoch + 1, 0, None, False
        elif self._broken == self._epoch:
            log.warning("clairvoyant: the last pass over epoch %d stopped before its end; this pass starts "
                        "that epoch again from position %d (call set_epoch(e) before each pass to choose, "
                        "or iterate to the end)", self._epoch, self._resume)
        self._broken = None
        start, self._resume, self._loaded_epoch = self._resume, 0, None
        plan = self._plan(start)
        self._start, self._span, self._done = start, len(plan), 0
        if self._reader_tuner is not None:
            self.num_workers = self._reader_tuner.readers
        if plan.whole is not None and self._tuner is not None and self._tuner.threads > RANGE_START_THREADS:
            # whole ranges: few requests, each long, and each idle thread costs CPU (docs/benchmarks.md):
            # the tuner starts lower and moves on from there
            self._tuner.threads = RANGE_START_THREADS
        run = EpochRun(plan=plan, source=self.source, manifest=self.manifest, tiers=self.tiers,
                       reader=self._reader_spec(start), options=self._run_options(), output=self._output,
                       stats=self._stats, progress=self._progress, tuner=self._tuner,
                       peer_fetch=self._cluster.fetch if self._cluster is not None else None,
                       ranges=self._range_reader() if plan.whole is not None else None)
        self._carry = (plan, run)
        if self._guard is not None:
            run.served = self._guard.recent
        if self._metrics is not None:
            run.on_batch = self._metrics.write
        return run

    @property
    def position(self) -> int:
        """Samples of the current epoch's order consumed by all ranks together (a prefix of the
        order, plan/partition.py): where a resume, at any world size, continues."""
        self._settle_epoch()
        if self._loaded_epoch is not None:
            return self._resume
        if self._span == 0:   # nothing iterated yet at this position
            return self._start
        return position_after(len(self.manifest), self._start, self._done, self.batch_size, self.world_size,
                              self._span)

    def guard(self, *, window: int = 50, threshold: float = 6.0, warmup: int = 20, rel_floor: float = 0.02,
              keep: int = 1) -> Guard:
        """Turn on the loss-spike guard against silent data corruption and return it (call before
        iterating). Hand it each step's loss with ``guard.step(loss)``: on a spike (robust score over
        the last ``window`` losses above ``threshold``, or a loss that is not finite; tune/spike.py)
        it re-reads the last ``keep`` batches' samples from the source and compares them with what
        was staged and served, and returns a verdict: the data was corrupt (which samples, where) or
        intact (reload the last checkpoint). Costs two checksum passes per batch while on."""
        if self._guard is None:
            self._guard = Guard(self, SpikeRule(window, threshold, warmup, rel_floor), keep)
        return self._guard

    def _run_options(self) -> RunOptions:
        """This pass's options, as the Loader holds them now (the tuners move readers and threads)."""
        return RunOptions(num_workers=self.num_workers,
                          stage_threads=self._tuner.threads if self._tuner is not None else self.stage_threads,
                          prefetch=self.prefetch, lookahead=self.lookahead, skip_errors=self.on_error == "skip",
                          mp_context=self.mp_context,
                          # ranks of a node keep samples for each other: a planned hit that another rank
                          # has not written yet is worth waiting for a moment rather than read twice
                          peer_wait=PEER_WAIT if self.topology.local_world_size > 1 else 0.0)

    def _reader_spec(self, position: int) -> ReaderSpec:
        return ReaderSpec(decode=self.decode, transform=self.transform, target_transform=self.target_transform,
                          collate_fn=self.collate_fn, source=self.source, seed=self.seed, epoch=self._epoch,
                          rank=self.rank, num_workers=self.num_workers, position=position,
                          stride=self.batch_size * self.world_size, worker_init_fn=self.worker_init_fn,
                          digests=self._guard is not None)

    def state_dict(self) -> dict:
        """JSON-serialisable position: resuming from it yields exactly the rest of the epoch, at this
        world size or another one (elastic resume); any rank's state serves every rank."""
        # batches_done: this rank's batches of the epoch at this layout (informative; position rules)
        done = self._start // (self.batch_size * self.world_size) + self._done
        return {"format": STATE_FORMAT, "version": 2, "epoch": self._epoch, "position": self.position,
                "batches_done": done, "seed": self.seed, "batch_size": self.batch_size,
                "shuffle": self.shuffle, "drop_last": self.drop_last, "rank": self.rank,
                "world_size": self.world_size, "num_samples": len(self.manifest),
                "manifest": self.manifest.fingerprint}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved position. The state may come from any rank of a job of any world size
        and batch size: the rest of that epoch is split over this job's ranks (plan/partition.py); the
        data, seed and shuffle must be the same."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ConfigError("not a clairvoyant loader state: pass what Loader.state_dict() returned")
        if state.get("version") not in (1, 2):
            raise ConfigError(f"loader state version {state.get('version')!r} is unknown to this clairvoyant "
                              "(it reads 1 and 2): pass what Loader.state_dict() returned, or upgrade clairvoyant")
        mine = self.state_dict()
        for key in ("seed", "shuffle", "num_samples", "manifest"):
            if state.get(key) != mine[key]:
                raise ConfigError(
                    f"the saved state has {key}={state.get(key)!r} but this loader has {mine[key]!r}: "
                    "resume with the same data, seed and shuffle (world size and batch size may change)")
        n = len(self.manifest)
        try:
            if state["version"] == 1:   # batches done by every rank of the saving job
                w, b = int(state["world_size"]), int(state["batch_size"])
                position = position_after(n, 0, int(state["batches_done"]), b, w,
                                          num_batches(-(-n // w), b, bool(state["drop_last"])))
            else:
                position = int(state["position"])
            epoch = int(state["epoch"])
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"the saved loader state is incomplete ({e!r}): pass what Loader.state_dict() "
                              "returned") from e
        if not 0 <= position <= n or epoch < 0:
            raise ConfigError(f"the saved position {position} of epoch {epoch} is outside [0, {n}]")
        self._close_active()
        self._epoch, self._resume, self._done, self._start, self._span = epoch, position, 0, position, 0
        self._loaded_epoch, self._deferred, self._broken = self._epoch, None, None
        self._passed = position == n   # saved at the epoch's end: a bare loop goes on with the next epoch

    # -- statistics and lifecycle ---------------------------------------------------------------

    def stats(self) -> dict:
        """Counters since this loader was made: source files/bytes, staged files, local hits,
        on-demand fetches, waits and wait time, batches, samples, skipped keys; per epoch
        (``epochs``: source files/bytes and where samples were read from); what the tiers did
        (``tiers``: hits, evictions, promotions, stale/corrupt entries) and their use (``usage``:
        capacity, bytes held now and at the peak, per tier)."""
        d = self._stats.snapshot()
        d["tiers"] = self.tiers.counters.snapshot()
        d["usage"] = self.tiers.usage()
        d["stages"] = stage_rates(d["tiers"], d["reader"])
        d["verdict"] = self._last_verdict
        d["stage_threads"] = self._tuner.threads if self._tuner is not None else self.stage_threads
        d["readers"] = self._reader_tuner.readers if self._reader_tuner is not None else self.num_workers
        if self._cluster is not None:
            d["cluster"] = dict(self._cluster.counters(), node=self._cluster.layout.node,
                                nodes=self._cluster.layout.num_nodes)
        return d

    def _epoch_done(self, run: EpochRun) -> None:
        """The epoch's verdict: logged (verdict=True) and written (metrics=) when asked."""
        w = run.window
        v = judge(w.waits, w.steps, w.samples, w.causes)
        if v is None:
            return
        self._last_verdict = dict(v.to_dict(), epoch=run.epoch)
        self._epochs_seen += 1
        if self._reader_tuner is not None and self._epochs_seen > 1:   # the first epoch is unlike the rest
            readers = sum(v.shares.get(c, 0.0) for c in ("queue", "read", "decode", "collate"))
            self._reader_tuner.epoch_done(v.samples_per_s, readers, v.keeps_up)
        if self._verdict_log:
            log.info("clairvoyant: %s", v.line(run.epoch))
        if self._metrics is not None:
            s = self.stats()
            self._metrics.write({"type": "epoch", "epoch": run.epoch, "verdict": v.to_dict(), "line": v.line(run.epoch),
                                 "reads": s["epochs"].get(run.epoch, {}), "stages": s["stages"]})
            self._metrics.flush()

    def _close_active(self) -> None:
        it = self._active() if self._active is not None else None
        if it is not None:
            it.close()
        self._active = None
        self._settle_epoch()

    def close(self) -> None:
        """Stop any iteration in progress and release every process, thread and buffer."""
        self._close_active()
        if self._carry is not None:
            self._carry[1].close()
        self._carry = None
        if self._progress is not None:
            self._progress.close()
        if self._metrics is not None:
            self._metrics.close()
        if self._guard is not None:
            self._guard.recent.clear()   # the batches it held for a check, and their mappings
        if self._cluster is not None:
            self._cluster.close()
        self._close_tiers()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close_tiers(tiers: Tiers) -> None:
    tiers.close()
    tiers.local.close()
    tiers.ram.close()


class EpochSetter:
    """``loader.sampler``: what frameworks that set a DataLoader's epoch through its sampler call."""

    def __init__(self, loader: Loader) -> None:
        self._loader = loader

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)


class _EpochIterator:
    """What ``iter(loader)`` returns; the pass is planned at its first ``next()``. Dropping it
    (early break, exception, GC) releases everything."""

    def __init__(self, loader: Loader) -> None:
        self._loader = loader
        self._run: EpochRun | None = None
        self._reported = False
        self.finished = False   # reached the epoch's end, or closed

    @property
    def started(self) -> bool:
        return self._run is not None

    def _mine(self) -> bool:
        ld = self._loader
        return ld._active is not None and ld._active() is self

    def __iter__(self) -> "_EpochIterator":
        return self

    def _started_run(self) -> EpochRun | None:
        """The pass's run, planned now if this is its first use; None once closed unstarted."""
        if self._run is None and not self.finished:
            self._run = self._loader._begin()
        return self._run

    def __len__(self) -> int:
        run = self._started_run()
        return 0 if run is None else len(run) - run.position

    def __next__(self) -> Any:
        loader = self._loader
        if self._started_run() is None:
            raise StopIteration
        try:
            out = self._run.next()
        except StopIteration:
            if self._run.completed and not self._reported:
                self._reported = True
                if self._mine():
                    loader._passed = True
                loader._epoch_done(self._run)
            self.finished = True
            raise
        loader._done += 1
        if loader._done >= loader._span and self._mine():   # the last batch (a framework may not ask past it)
            loader._passed = True
        return out

    def close(self) -> None:
        if self._run is not None and not self.finished and self._mine() and not self._loader._passed:
            self._loader._broken = self._loader._epoch   # stopped before the epoch's end
        self.finished = True
        if self._run is not None:
            self._run.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
