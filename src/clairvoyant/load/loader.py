"""The Loader: what the training loop holds.

It lists the source once (persisted manifest), plans each epoch's order as a
pure function of (seed, epoch, rank), stages upcoming samples to node-local
storage while reader processes decode the already-staged ones, and yields
batches in plan order. PyTorch conventions: ``len``, ``set_epoch``,
``state_dict`` / ``load_state_dict``, ``shuffle``, ``drop_last``. Its parts: the passes over
epochs and the iterator (load/passes.py), its footing on the node and in the job (load/node_session.py),
the saved state (load/state.py); each epoch runs in load/pipeline.py.
"""

from __future__ import annotations

import functools
import logging
import os
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from .. import manifest as manifest_mod
from ..cache import codec as codec_mod
from ..cache.entry import entry_size
from ..cluster import job as cluster_mod
from ..cluster.job import Cluster
from ..cluster.topology import validate
from ..errors import ConfigError, EmptySourceError
from ..plan import num_batches
from ..plan.layout import NodeLayout
from ..plan.compression import stored_sizes
from ..plan.rank_plan import PlanConfig, RankEpochPlan
from ..source import as_source, is_dataset
from ..tune.autotune import ReaderTuner
from ..tune.inflight import InFlight
from ..tune.metrics import MetricsLog, stage_rates
from ..tune.spike import SpikeRule
from ..tune.stats import Stats
from ..tune.verdict import judge
from .decode import decode_pil
from .decode import resolve as resolve_decode
from .given import check_without_files, dataloader_keywords, from_dataset
from .guard import Guard
from .heap import trim_heap
from .node_session import NodeSession, close_tiers, compress_sample, place
from .options import LoaderOptions, RunOptions
from .passes import EpochCursor, EpochSetter, _EpochIterator
from .pipeline import LEND, EpochRun
from .pool import WorkerPool
from .state import STATE_FORMAT, check_format, resume_point
from .transport import Output
from .worker import ReaderSpec

__all__ = ["Loader", "EpochSetter", "STATE_FORMAT", "PEER_WAIT", "AUTO_START_THREADS", "RANGE_START_THREADS"]

log = logging.getLogger("clairvoyant")
PEER_WAIT = 2.0   # seconds
AUTO_START_THREADS = 64   # requests in flight before staging measured the store (tune/inflight.py moves it)
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
            and target_transform are used as they are); any other map-style dataset (``FakeData``,
            tensors in memory: nothing to stage, its ``__getitem__`` runs in the readers); or a source object (e.g.
            ``clairvoyant.testing.EmulatedStore``, ``clairvoyant.ListedSource``); or an object store
            URL (``s3://bucket/prefix``, ``gs://...``, ``https://...``: docs/object-stores.md); or
            arrays in files: tar shards, ``.npy``/``.npz``, ``.tfrecord``, HDF5 (``.h5``), each a path,
            a glob or a directory of them (a sample per row, record or index).
        storage_options: with a URL source, the fsspec file system's options (credentials, endpoint_url).
        dataset, labels: with HDF5 files or an ``.npz``, the array that holds the samples (a sample
            per index along its first axis) and one that holds their labels: integers (class indices),
            or float or vector targets (a regression's), each sample's row its target as PyTorch
            collates it.
        fields: arrays beside the samples of HDF5 or ``.npy``/``.npz`` files (or columns of a
            ``.csv``/``.jsonl`` list file) that travel with each sample: batches are then
            ``(samples, labels, {name: values})``.
        compress: compressed staging of the local tier (docs/user-guide.md "Compressed staging"):
            None (default: entries as they are), ``"zstd"`` (``pip install clairvoyant[compress]``),
            ``"zlib"``, or ``"auto"``: a few samples are compressed first, and the tier compresses
            where they shrink by 15% or more (float and integer fields, not JPEGs). The capacity then
            counts the compressed bytes, so more of the data set fits; readers inflate.
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
        stage_threads: requests to the source in flight (I/O threads), or ``"auto"`` (the default):
            set from the store every quarter second, by what staging measures (more while requests
            wait and more in flight still fetch more, held at the store's knee, fewer when they
            idle; tune/inflight.py); ``stats()["staging"]`` says the choice and why.
        lookahead: how many batches ahead of the training loop staging runs.
        prefetch: batches each reader may hold ready.
        persistent_workers: keep the reader processes from one pass to the next (as DataLoader's):
            later epochs skip forking them (tens of ms per reader from a large process). They keep
            what they were forked with: a transform, decode, collate or source given anew (a new
            object), or another reader count, forks new readers; a transform object changed in
            place is not seen by them (as with DataLoader). ``worker_init_fn`` runs once per reader.
            A pass left before its end ends its readers. Default False.
        rank, world_size: default from the ``torch.distributed`` process group when one is initialised
            (Lightning, Accelerate, torchrun; also when it is initialised after the Loader was made,
            before the first iteration), else from torchrun, MPI or SLURM variables, else a single
            process. Launcher variables that disagree with the process group are a ``ConfigError``.
        on_error: ``"raise"`` (default) or ``"skip"`` samples that cannot be read or decoded.
        manifest: path of the persisted manifest (default: under the per-user cache).
        reindex: walk the source again even if a manifest exists.
        output: ``"auto"`` (torch tensors if PyTorch is installed), ``"torch"`` or ``"numpy"``.
        pin_memory: copy batches into page-locked memory (when CUDA is available).
        device: where batches arrive (e.g. ``"cuda"``; None: the CPU, as the readers make them).
            Where the transform runs on uint8 (``stats()["transform"]``), images travel as uint8 (a
            quarter of the bytes) and are converted and normalized there; otherwise every tensor of
            the batch is moved. A training loop's own ``.to(device)`` is then a no-op.
        **dataloader: torch DataLoader keywords a ported script may still pass: ``prefetch_factor``
            and ``multiprocessing_context`` are ``prefetch`` and ``mp_context``, ``in_order=True``
            holds; ``sampler``, ``batch_sampler``, ``generator``, ``timeout`` and
            ``pin_memory_device`` are a ConfigError saying what to do instead; any other name, a
            TypeError.
        decode_on: ``"readers"`` (the default) or ``"device"``: with ``device=`` and the transform
            on uint8, the readers send each JPEG with what its transform drew (nothing decoded
            there) and the batch's JPEGs are decoded on the device at once (torchvision's
            ``decode_jpeg``: nvJPEG on a GPU), cropped and resized there; for a GPU whose readers'
            decode cannot keep up (``stats()["verdict"]`` says decode). Other files are decoded by
            the readers as before. A JPEG whose body is corrupt is then a DecodeError at delivery
            (``on_error="skip"`` cannot drop it from its batch).
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
                 storage_options: dict | None = None, dataset: str | None = None,
                 labels: str | None = None, fields: Sequence[str] | str = (),
                 compress: str | None = None, device: Any = None, decode_on: str = "readers",
                 persistent_workers: bool = False, **dataloader: Any) -> None:
        # checked once, here, before anything is set up (load/options.py); read from there after
        if dataloader:   # a DataLoader's keywords, as a ported script passes them (load/given.py)
            got = dataloader_keywords(dataloader, prefetch=prefetch, mp_context=mp_context)
            prefetch, mp_context = got["prefetch"], got["mp_context"]
        if decode_on not in ("readers", "device"):
            raise ConfigError(f"decode_on={decode_on!r}: choose 'readers' or 'device' (with device=)")
        self.options = options = LoaderOptions(
            batch_size=batch_size, seed=seed, shuffle=shuffle, drop_last=drop_last, on_error=on_error,
            num_workers=num_workers, stage_threads=stage_threads, prefetch=prefetch, lookahead=lookahead,
            mp_context=mp_context, persistent_workers=persistent_workers)
        self._tuner: InFlight | None = InFlight(AUTO_START_THREADS) if options.tuned_threads else None
        stage_threads = AUTO_START_THREADS if options.tuned_threads else stage_threads
        for name, fn in (("transform", transform), ("target_transform", target_transform),
                         ("worker_init_fn", worker_init_fn)):
            if fn is not None and not callable(fn):
                raise ConfigError(f"{name}={fn!r} is not callable")
        if is_dataset(source):   # a torchvision-style dataset: its files, labels and transforms
            source, transform, target_transform = from_dataset(source, decode, transform, target_transform)
        self.decode = resolve_decode(decode, has_transform=transform is not None)
        self.transform, self.target_transform, self.worker_init_fn = transform, target_transform, worker_init_fn
        if (rank is None) != (world_size is None):
            raise ConfigError("pass both rank and world_size, or neither (then they come from the launcher)")
        lws_given = None if local_world_size is None else int(local_world_size)
        if rank is None:   # the process group if there is one, else the launcher's variables
            topology = place(lws_given)
        else:
            topology = validate(int(rank), int(world_size), local_world_size=int(local_world_size or 1))
        self.source = as_source(source, storage_options, dataset=dataset, labels=labels, fields=fields)
        if self.source.made_in_reader:   # a dataset with no files: its __getitem__ makes each sample
            check_without_files(self.source, decode=decode, transform=transform, target_transform=target_transform,
                                compress=compress, cluster=cluster)
            local_capacity = ram_capacity = 0
            cluster, compress = False, None
            self._tuner, stage_threads = None, 1   # (nothing to stage: one idle thread, no tuning)
        if decode is None and self.source.decoder is not None:   # arrays: back to their dtype and shape
            self.decode = self.source.decoder
        self.manifest, self.indexed = manifest_mod.obtain(self.source, manifest, reindex=reindex)
        self.source.use_manifest(self.manifest)   # an object store reads exactly the listed sizes
        if len(self.manifest) == 0:
            raise EmptySourceError(f"data source {self.source.uri} holds no samples: check the path")
        # compressed staging (cache/codec.py): decided from a few samples, alike on every rank (the
        # cluster's ranks compare it below: they plan and send entries by it)
        self._codec, self.compress_ratio = codec_mod.choose(compress, lambda: compress_sample(self.source,
                                                                                             self.manifest))
        # the job's nodes as one cache (cluster/job.py): joined now, at the first pass, or never
        self._joining = cluster_mod.Joining(cluster, lambda: cluster_mod.fingerprint(
            manifest=self.manifest.fingerprint, seed=options.seed, batch_size=options.batch_size,
            shuffle=options.shuffle, drop_last=options.drop_last,
            compress=f"{getattr(self._codec, 'name', None)}:{self.compress_ratio:.9f}"))
        self._cluster: Cluster | None = self._joining.now(topology)
        if self._cluster is not None:
            topology = self._cluster.layout
        self._output = Output(output, pin_memory, device)   # checked before anything is set up on disk
        sizes = np.asarray(self.manifest.sizes)
        # what tiers count, per sample; int32 where every entry fits (14.2 M samples: 57 MB, not 114)
        small = len(sizes) == 0 or int(sizes.max()) + entry_size(0) < 2**31
        self._raw_entry_sizes = sizes.astype(np.int32 if small else np.int64) + np.int32(entry_size(0))
        # compressed staging: the plan counts each sample's entry at the measured ratio, the
        # capacity stays a share of the raw data set
        self._entry_sizes = (stored_sizes(sizes.astype(self._raw_entry_sizes.dtype), self.compress_ratio,
                                          entry_size(0)) if self._codec is not None else self._raw_entry_sizes)
        # the node's part (load/node_session.py): tiers, gate, place in the job, plans, serving
        self._node = NodeSession(self.source, self.manifest, topology, entry_sizes=self._entry_sizes,
                                 raw_entry_sizes=self._raw_entry_sizes,
                                 config=PlanConfig(len(self.manifest), options.batch_size, options.seed,
                                                   options.shuffle, options.drop_last),
                                 cluster=self._cluster, topology_given=rank is not None,
                                 local_world_size=lws_given, balance=bool(balance))
        self.tiers = self._node.open_tiers(local_dir, ram_dir, local_capacity, ram_capacity)
        self.tiers.local.codec, self.tiers.compress_ratio = self._codec, self.compress_ratio
        if self._cluster is not None:
            self._cluster.start(self.tiers.local_capacity, self._node.serve)
        # leaves the node's tiers (the last one out empties the RAM tier) on close, GC or exit
        self._close_tiers = weakref.finalize(self, close_tiers, self.tiers)
        self._node.open_progress()
        self.store = self.tiers.local
        self.collate_fn = collate_fn
        self._fast, self._transform_path = self._transform_recipe(decode)
        if self._fast is not None and self._output.device is not None:   # uint8 to the device, converted there
            from .fast_transform import decode_batch, finish
            self._output.convert = functools.partial(finish, self._fast)
            self._transform_path["why"] += f"; converted and normalized on {self._output.device}"
            if decode_on == "device":   # the JPEGs too, decoded there
                self._output.decode = functools.partial(decode_batch, self._fast, self._output.device)
                self._transform_path["why"] += f"; JPEGs decoded on {self._output.device}"
        self._transform_path["decode_on"] = "device" if self._output.decode is not None else "readers"
        if decode_on == "device" and self._output.decode is None:
            log.warning("clairvoyant: decode_on='device' but the readers decode: %s", "no device= given"
                        if self._output.device is None else f"the transform runs as given ({self._transform_path['why']})")
        self._reader_tuner = ReaderTuner(_default_workers()) if num_workers is None else None
        self.num_workers = num_workers or self._reader_tuner.readers
        if num_workers is None:   # what a DataLoader's num_workers (a script's -j) set is chosen here
            log.info("clairvoyant: %d reader processes to start, tuned each epoch (num_workers= fixes the count)",
                     self.num_workers)
        self._epochs_seen = 0
        self.stage_threads = stage_threads   # (with "auto", where the tuner starts)
        self._stats = Stats()
        self._verdict_log = bool(verdict)
        self._last_verdict: dict | None = None
        self._metrics = MetricsLog(os.fspath(metrics)) if metrics is not None else None
        self._cursor = EpochCursor()   # the epoch and the position (load/passes.py)
        self._guard: Guard | None = None   # the loss-spike guard, once guard() was called
        self._readers: list[WorkerPool] = []   # the readers kept across passes (persistent_workers)
        self._close_readers = weakref.finalize(self, _close_pools, self._readers)   # (on close, GC or exit)

    # -- the options, as given (load/options.py) ------------------------------------------------

    batch_size = property(lambda self: self.options.batch_size, doc="Samples per batch (per rank).")
    seed = property(lambda self: self.options.seed, doc="The seed of every epoch's order.")
    shuffle = property(lambda self: self.options.shuffle)
    drop_last = property(lambda self: self.options.drop_last)
    on_error = property(lambda self: self.options.on_error)
    prefetch = property(lambda self: self.options.prefetch)
    lookahead = property(lambda self: self.options.lookahead)
    mp_context = property(lambda self: self.options.mp_context)

    # -- PyTorch conventions (set_epoch, iter() and position: load/passes.py) -------------------

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next iteration follows. Optional: without it, each
        iteration after a complete pass moves to the next epoch."""
        self._cursor.set_epoch(epoch)

    def __iter__(self) -> _EpochIterator:
        """One pass over the rest of the current epoch. After a pass that reached the epoch's end,
        the next iteration is the next epoch's (as a re-shuffling DataLoader draws a new order each
        pass) unless ``set_epoch`` was called in between. The pass is planned at its first batch,
        so a ``set_epoch`` between ``iter()`` and the first ``next()`` still counts (Lightning
        calls them in that order)."""
        return self._cursor.iterate(self._begin, self._epoch_done)

    @property
    def position(self) -> int:
        """Samples of the current epoch's order consumed by all ranks together (a prefix of the
        order, plan/partition.py): where a resume, at any world size, continues."""
        return self._cursor.position(len(self.manifest), self.batch_size, self.world_size)

    @property
    def _epoch(self) -> int:   # (the epoch the next or current pass follows)
        return self._cursor.epoch

    @property
    def topology(self) -> NodeLayout:
        """Where this process sits: rank, world size, the node's ranks (cluster/topology.py)."""
        return self._node.topology

    @property
    def capacities(self) -> dict:
        """The local and RAM tiers' capacities, with how each was chosen."""
        return self._node.capacities

    @property
    def _carry(self) -> tuple[RankEpochPlan, EpochRun] | None:   # the last epoch's plan and its run
        return self._node.carry

    @property
    def _inventory_used(self) -> bool:   # (the tier's inventory served the first plan; then its index)
        return self._node.inventory_used

    @_inventory_used.setter
    def _inventory_used(self, used: bool) -> None:
        self._node.inventory_used = used

    def _residents(self) -> dict[int, int]:
        return self._node.residents()

    @property
    def rank(self) -> int:
        return self._node.where().rank

    @property
    def world_size(self) -> int:
        return self._node.where().world_size

    @property
    def sampler(self) -> "EpochSetter":
        """For frameworks that call ``loader.sampler.set_epoch(e)`` (Lightning does, on every epoch):
        it calls ``set_epoch`` here."""
        return EpochSetter(self)

    batch_sampler = None   # as a DataLoader with a sampler has it; frameworks look for both

    def __len__(self) -> int:
        per_rank = -(-len(self.manifest) // self.world_size)
        return num_batches(per_rank, self.batch_size, self.drop_last)

    def _form_cluster(self) -> None:
        """The cluster put off at construction, formed at the first pass (cluster/job.py
        ``Joining``): the node's topology, tiers and serving follow it."""
        c = self._joining.at_first_pass(self._node.where())   # (the process group's place now)
        if c is None:
            return
        self._cluster = c
        node = self._node
        node.rebind(c.layout, cluster=c)
        c.start(self.tiers.local_capacity, node.serve)
        log.info("clairvoyant: rank %d of %d joined the cluster cache of %d nodes at its first pass (%s)",
                 c.rank, c.world_size, c.layout.num_nodes, c.counters().get("transport", ""))

    def _begin(self) -> EpochRun:
        """Plan the pass and start its run: at the first ``next()`` of an iterator."""
        if self._joining.pending:
            self._form_cluster()
        self._node.bind()
        start = self._cursor.next_pass()
        plan = self._node.plan(self._cursor.epoch, start)
        trim_heap()   # the plan's temporaries freed: their pages back to the system
        self._cursor.started(start, len(plan))
        if self._reader_tuner is not None:
            self.num_workers = self._reader_tuner.readers
        if plan.whole is not None and self._tuner is not None and self._tuner.limit > RANGE_START_THREADS:
            # whole ranges: few requests, each long, and each idle thread costs CPU (docs/benchmarks.md):
            # the tuner starts lower and moves on from there
            self._tuner.limit = RANGE_START_THREADS
        spec, options = self._reader_spec(start), self._run_options()
        run = EpochRun(plan=plan, source=self.source, manifest=self.manifest, tiers=self.tiers,
                       reader=spec, options=options, output=self._output,
                       stats=self._stats, progress=self._node.progress, tuner=self._tuner,
                       peer_fetch=self._node.peer_fetch if self._cluster is not None else None,
                       ranges=self._node.range_reader() if plan.whole is not None else None,
                       pool=self._kept_readers(spec, options))
        self._node.carry = (plan, run)
        if self._guard is not None:
            run.served = self._guard.recent
        if self._metrics is not None:
            run.on_batch = self._metrics.write
        return run

    def _kept_readers(self, spec: ReaderSpec, options: RunOptions) -> WorkerPool | None:
        """With ``persistent_workers``, the readers for this pass: the last pass's where they can
        serve it (load/pool.py ``reusable``), else new ones (forked now, before any staging thread
        of the pass); None: the pass forks its own."""
        if not self.options.persistent_workers:
            return None
        slots = options.prefetch + LEND
        if self._readers and self._readers[0].reusable(spec, slots, options.mp_context):
            return self._readers[0]
        _close_pools(self._readers)
        self._readers.append(WorkerPool(options.num_workers, slots, spec, options.mp_context))
        return self._readers[0]

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
        return self.options.run(self.num_workers, self._tuner.limit if self._tuner is not None else self.stage_threads,
                                # ranks of a node keep samples for each other: a planned hit that another
                                # rank has not written yet is worth waiting for a moment rather than read twice
                                peer_wait=PEER_WAIT if self.topology.local_world_size > 1 else 0.0)

    def _transform_recipe(self, decode) -> tuple[Any, dict]:
        """The transform's recipe where load/fast_transform.py carries it out on uint8, and which path
        runs and why (``stats()["transform"]``, logged once)."""
        from .fast_transform import Recipe, recognize
        if self.transform is None:
            return None, {"path": "none", "why": "no transform"}
        if os.environ.get("CLAIRVOYANT_FAST_TRANSFORM", "1") == "0":
            why = "CLAIRVOYANT_FAST_TRANSFORM=0"
        elif decode is not None:
            why = f"decode={decode!r} is given: the transform takes what it returns"
        elif self.decode is not decode_pil:
            why = "the source's samples are not image files (its own decoder makes them)"
        elif self.collate_fn is not None:
            why = "collate_fn= is given"
        elif self.source.has_fields:
            why = "the samples have fields besides the image"
        else:
            try:
                got = recognize(self.transform)
            except Exception as e:   # noqa: BLE001 - a transform it cannot read runs as given
                got = f"its parameters could not be read ({type(e).__name__}: {e})"
            if isinstance(got, Recipe):
                log.info("clairvoyant: the transform (%s) runs on uint8, a batch at a time (its draws are "
                         "torchvision's)", got.described)
                return got, {"path": "fast", "why": got.described}
            why = got
        log.info("clairvoyant: the transform runs as given, per sample: %s", why)
        return None, {"path": "as given", "why": why}

    def _reader_spec(self, position: int) -> ReaderSpec:
        return ReaderSpec(decode=self.decode, transform=self.transform, target_transform=self.target_transform,
                          collate_fn=self.collate_fn, source=self.source, seed=self.seed, epoch=self._epoch,
                          rank=self.rank, num_workers=self.num_workers, position=position,
                          stride=self.batch_size * self.world_size, worker_init_fn=self.worker_init_fn,
                          digests=self._guard is not None, fast=self._fast,
                          fast_uint8=self._output.convert is not None, fast_defer=self._output.decode is not None)

    def state_dict(self) -> dict:
        """JSON-serialisable position: resuming from it yields exactly the rest of the epoch, at this
        world size or another one (elastic resume); any rank's state serves every rank."""
        # batches_done: this rank's batches of the epoch at this layout (informative; position rules)
        c = self._cursor
        done = c.start // (self.batch_size * self.world_size) + c.done
        return {"format": STATE_FORMAT, "version": 2, "epoch": self._epoch, "position": self.position,
                "batches_done": done, "seed": self.seed, "batch_size": self.batch_size,
                "shuffle": self.shuffle, "drop_last": self.drop_last, "rank": self.rank,
                "world_size": self.world_size, "num_samples": len(self.manifest),
                "manifest": self.manifest.fingerprint}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved position. The state may come from any rank of a job of any world size
        and batch size: the rest of that epoch is split over this job's ranks (plan/partition.py); the
        data, seed and shuffle must be the same."""
        check_format(state)
        n = len(self.manifest)
        epoch, position = resume_point(state, self.state_dict(), n)
        self._cursor.load(epoch, position, at_end=position == n)

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
        d["stage_threads"] = self._tuner.limit if self._tuner is not None else self.stage_threads
        d["staging"] = self._staging_choice()
        d["transform"] = dict(self._transform_path)
        d["readers"] = self._reader_tuner.readers if self._reader_tuner is not None else self.num_workers
        if self._cluster is not None:
            d["cluster"] = dict(self._cluster.counters(), node=self._cluster.layout.node,
                                nodes=self._cluster.layout.num_nodes)
        return d

    def _staging_choice(self) -> dict:
        """The requests in flight staging keeps at the store, and why (tune/inflight.py)."""
        if self._tuner is not None:
            return self._tuner.describe()
        return {"inflight": self.stage_threads, "why": f"{self.stage_threads} in flight: stage_threads set by the caller"}

    def _epoch_done(self, run: EpochRun) -> None:
        """The epoch's verdict: logged (verdict=True) and written (metrics=) when asked."""
        w = run.window
        v = judge(w.waits, w.steps, w.samples, w.causes)
        if v is None:
            return
        staging = self._staging_choice()
        self._last_verdict = dict(v.to_dict(), epoch=run.epoch, staging=staging)
        self._epochs_seen += 1
        if self._reader_tuner is not None and self._epochs_seen > 1:   # the first epoch is unlike the rest
            readers = sum(v.shares.get(c, 0.0) for c in ("queue", "read", "decode", "collate"))
            self._reader_tuner.epoch_done(v.samples_per_s, readers, v.keeps_up)
        if self._verdict_log:   # with the requests in flight staging chose, and why
            log.info("clairvoyant: %s; staging: %s", v.line(run.epoch), staging["why"])
        if self._metrics is not None:
            s = self.stats()
            self._metrics.write({"type": "epoch", "epoch": run.epoch, "verdict": v.to_dict(), "line": v.line(run.epoch),
                                 "reads": s["epochs"].get(run.epoch, {}), "stages": s["stages"]})
            self._metrics.flush()

    def close(self) -> None:
        """Stop any iteration in progress and release every process, thread and buffer."""
        self._cursor.close_active()
        self._close_readers()
        self._node.close()
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


def _close_pools(pools: list[WorkerPool]) -> None:
    """End the readers a Loader kept across passes, if any (its close, its collection, the exit)."""
    while pools:
        pools.pop().close()
