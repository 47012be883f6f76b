"""The reader worker process: read staged samples, decode, transform, collate into a shared slot.

A reader gets a :class:`ReaderSpec` when it is forked (what to do with a
sample) and then :class:`Job` records, one per batch, or None to stop
(:func:`send_job`: the bytes of RAM-window samples out of band, beside the
record). It answers :class:`Loaded` (the batch is in the slot) or
:class:`Failed` (the slot is untouched). Only these small records cross the
pipe back; batch data travels in the slot.

Every cached entry is checked against its checksum as it is read. An entry that
is corrupt, truncated or gone is never decoded: the sample is read from the
source instead and reported in ``repaired`` (position, reason), and the
training process has the entry removed.

Per sample: ``decode`` (bytes to a sample), then ``transform`` (sample) and
``target_transform`` (label), as torchvision's datasets apply them; a source
with extra fields per sample (``has_fields``, ``fields_of``) adds a third element. Before each
batch the reader seeds the global random generators from the batch's identity
(load/seeding.py). With ``digests`` on (the loss-spike guard) the reader
records the checksum of the bytes it decoded and of each array it wrote.
"""

from __future__ import annotations

import ctypes
import functools
import pickle
import signal
import struct
import sys
import time
import traceback
import weakref
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any, Callable, NamedTuple

import xxhash

from ..cache.entry import read_sample
from ..cache.extents import Loc
from ..errors import CorruptEntry
from . import direct, fast_transform, seeding
from .collate import default_collate
from .heap import keep_heap
from .transport import Slot, pack

# Fault injection for the guard's tests: keys whose bytes get one flipped bit after their entry's
# checksum was verified (a memory error in the reader). Set in the training process before the
# readers are forked.
FLIP_AFTER_CHECK: set[str] = set()


@dataclass(frozen=True)
class ReaderSpec:
    """What a reader does with each sample and batch, fixed for one epoch."""

    decode: Callable[[bytes], Any]
    transform: Callable | None
    target_transform: Callable | None
    collate_fn: Callable | None
    source: Any
    seed: int
    epoch: int
    rank: int
    num_workers: int
    position: int                 # the epoch's global position at batch 0 of this run
    stride: int                   # positions per batch (batch size x world size)
    worker_init_fn: Callable[[int], None] | None = None
    digests: bool = False
    fast: Any = None   # the transform's recipe where load/fast_transform.py carries it out (uint8, per batch)
    fast_uint8: bool = False   # ... its images left uint8 (converted on the Loader's device=)
    fast_defer: bool = False   # ... its JPEGs not decoded here: sent with their draws (decode_on="device")


class Pass(NamedTuple):
    """A kept reader's next pass (``persistent_workers``, load/pool.py ``next_pass``): what changes
    from one pass to the next. The reader seeds itself as a reader forked for it would."""

    epoch: int
    position: int
    stride: int


class Item(NamedTuple):
    key: str
    path: Loc | None       # where its local entry is
    size: int
    label: int
    data: bytes | None     # the bytes themselves (RAM window)
    from_source: bool      # not cached: read the source here


class Job(NamedTuple):
    batch: int
    slot: int
    items: list[Item]
    skip: bool


class Loaded(NamedTuple):
    batch: int
    slot: int
    spec: Any
    size: int
    skipped: list[tuple[str, str]]
    repaired: list[tuple[int, str]]           # (position in items, why the entry was not used)
    times: tuple[float, float, float, float]  # local read, decode, collate, source read seconds
    served: list[tuple[int, str, int]] | None  # (position, where from, xxh3 of the bytes decoded)
    leaves: list[int] | None                  # xxh3 of each array written into the slot


class Failed(NamedTuple):
    batch: int
    slot: int
    kind: str      # read, decode, transform, getitem, empty, collate
    key: str
    message: str
    traceback: str


# -- the job's wire: the record pickled, the samples' bytes beside it --------------------------------

_BUFFERS = struct.Struct("<I")
_TORN: "weakref.WeakSet[Connection]" = weakref.WeakSet()


def send_job(conn: Connection, job: Job | Pass | None) -> None:
    """Send ``job`` (a ``Pass``: the next pass begins; None: stop) to a reader. The bytes of
    samples that go through the RAM window travel out of band, each as a message of its own,
    after the pickled record (pickle protocol 5):
    no message of a whole batch's bytes is ever built. Pickled whole, a batch of 256 samples read
    from the source was one 17-28 MB buffer, allocated and copied at every dispatch by whichever
    staging thread dispatched it, and the allocator kept those buffers' pages afterwards."""
    buffers: list[pickle.PickleBuffer] = []
    if isinstance(job, Job) and any(it.data is not None for it in job.items):
        job = job._replace(items=[it if it.data is None else it._replace(data=pickle.PickleBuffer(it.data))
                                  for it in job.items])
    record = pickle.dumps(job, protocol=5, buffer_callback=buffers.append)
    try:
        conn.send_bytes(_BUFFERS.pack(len(buffers)) + record)   # (itself two writes when large)
        for b in buffers:
            conn.send_bytes(b.raw())
    except BaseException:   # Ctrl-C half way: the reader waits for bytes that never come
        _TORN.add(conn)
        raise


def torn(conn: Connection) -> bool:
    """Whether a job's messages to this reader stopped half way (:func:`send_job` interrupted): it
    waits for bytes that will never come and cannot be told to stop, only ended."""
    return conn in _TORN


def recv_job(conn: Connection) -> Job | Pass | None:
    """The next job :func:`send_job` sent (the training process's own records, over the reader's
    pipe from its parent)."""
    head = conn.recv_bytes()
    (count,) = _BUFFERS.unpack_from(head)
    buffers = [conn.recv_bytes() for _ in range(count)]
    return pickle.loads(memoryview(head)[_BUFFERS.size:], buffers=buffers)


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


READY = "ready"   # a reader's first message: it came through the fork (load/pool.py waits for it)


def worker_main(wid: int, conn, slots: list[Slot], spec: ReaderSpec) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C belongs to the training process
    _die_with_parent()
    conn.send(READY)
    keep_heap()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)   # as PyTorch's workers: readers are the parallelism
    _seed_reader(wid, spec)
    if spec.worker_init_fn is not None:
        try:
            spec.worker_init_fn(wid)
        except Exception as e:
            conn.send(Failed(-1, -1, "init", "", f"worker_init_fn({wid}) raised {type(e).__name__}: {e}",
                             traceback.format_exc()))
            return
    collate = spec.collate_fn or default_collate
    while True:
        try:
            job = recv_job(conn)
        except (EOFError, OSError):
            return
        if job is None:
            return
        if isinstance(job, Pass):   # kept for another pass: its epoch and positions from now on
            spec = replace(spec, epoch=job.epoch, position=job.position, stride=job.stride)
            _seed_reader(wid, spec)
            continue
        seeding.seed_generators(seeding.batch_seed(spec.seed, spec.epoch, spec.rank,
                                                   spec.position + job.batch * spec.stride))
        conn.send(_load_batch(job, slots, spec, collate))


def _seed_reader(wid: int, spec: ReaderSpec) -> None:
    """The reader's seeds for its pass (``get_worker_info``'s, and the generators' base)."""
    seeding.start_reader(seeding.ReaderInfo(wid, spec.num_workers,
                                            seeding.reader_seed(spec.seed, spec.epoch, spec.rank, wid),
                                            spec.epoch, spec.rank))


def _read(item: Item, source) -> tuple[bytes, str | None, str]:
    """The sample's bytes, why the cached entry could not be used (None if it was), where from."""
    if item.data is not None:
        return item.data, None, "ram"
    if item.from_source or item.path is None:
        return source.read(item.key), None, "source"
    try:
        loc = item.path
        data = read_sample(loc, item.size)
        if item.key in FLIP_AFTER_CHECK:
            data = bytes([data[0] ^ 0x10]) + data[1:]
        return data, None, "local"
    except FileNotFoundError:
        why = "gone"
    except CorruptEntry as e:
        why = str(e)
    return source.read(item.key), why, "source"


def _load_batch(job: Job, slots: list[Slot], spec: ReaderSpec, collate: Callable) -> Loaded | Failed:
    if spec.source.made_in_reader:   # a dataset with no files: nothing to read or decode
        return _load_made(job, slots, spec, collate)
    reads = None
    if spec.collate_fn is None and direct.eligible(spec):
        out = _load_direct(job, slots[job.slot], spec)
        if not isinstance(out, list):
            return out
        reads = out   # declined: the general path goes on from the bytes already read
    return _load_general(job, slots, spec, collate, reads)


class _ReadFailed(NamedTuple):
    error: Exception
    traceback: str


def _load_direct(job: Job, slot: Slot, spec: ReaderSpec) -> Loaded | list:
    """The default decoder's batch of same-sized JPEGs, each decoded straight into its place in the
    slot: no decoded copy to allocate and collate. When the batch does not qualify (another
    format, mixed sizes, a read that failed), what was read (``(data, why, where, seconds)`` or a
    ``_ReadFailed`` per item) for the general path, which never reads a sample a second time and
    counts each read's seconds as it would have (the source's apart)."""
    clock = time.perf_counter
    t0 = clock()
    reads: list = []
    from_source = 0.0   # of the reads, the time spent reading the source itself
    for item in job.items:
        t = clock()
        try:
            reads.append((*_read(item, spec.source), clock() - t))   # (data, why, where, seconds)
        except Exception as e:
            reads.append(_ReadFailed(e, traceback.format_exc()))
        if not isinstance(reads[-1], _ReadFailed) and reads[-1][2] == "source":
            from_source += reads[-1][3]
    if any(isinstance(r, _ReadFailed) for r in reads):
        return reads
    t1 = clock()
    blobs = [r[0] for r in reads]
    packed = direct.decode_batch(blobs, [item.label for item in job.items], slot, digests=spec.digests)
    if packed is None:
        return reads
    spec_, size, leaves = packed
    repaired = [(j, r[1]) for j, r in enumerate(reads) if r[1] is not None]
    served = ([(j, r[2], xxhash.xxh3_64_intdigest(r[0])) for j, r in enumerate(reads)]
              if spec.digests else None)
    return Loaded(job.batch, job.slot, spec_, size, [], repaired, (t1 - t0 - from_source, clock() - t1, 0.0, from_source),
                  served, leaves)


def _load_general(job: Job, slots: list[Slot], spec: ReaderSpec, collate: Callable,
                  reads: list | None = None) -> Loaded | Failed:
    """Read (unless ``reads`` holds what was read already), decode, transform and collate a batch."""
    samples, skipped, repaired = [], [], []
    served: list[tuple[int, str, int]] | None = [] if spec.digests else None
    fields_of = spec.source.fields_of if spec.source.has_fields else None
    target_field = spec.source.target_field
    clock = time.perf_counter
    read_s = decode_s = source_s = 0.0
    k, slot_id = job.batch, job.slot
    for j, item in enumerate(job.items):
        t0 = clock()
        try:
            got = _read(item, spec.source) if reads is None else reads[j]
            if isinstance(got, _ReadFailed):
                raise got.error
            data, why, where = got[:3]
        except Exception as e:
            if job.skip:
                skipped.append((item.key, f"{type(e).__name__}: {e}"))
                continue
            tb = reads[j].traceback if reads is not None and isinstance(reads[j], _ReadFailed) \
                else traceback.format_exc()
            return Failed(k, slot_id, "read", item.key, f"cannot read sample {item.key!r}: {e}", tb)
        if why is not None:
            repaired.append((j, why))
        t1 = clock()
        took = t1 - t0 if reads is None else got[3]   # (read before, by the direct path: its time)
        if where == "source":
            source_s += took
        else:
            read_s += took
        stage = "decode"
        try:
            if spec.fast is not None:   # decode and geometry on uint8 (load/fast_transform.py)
                sample = (fast_transform.defer if spec.fast_defer else fast_transform.apply)(spec.fast, data)
            else:
                sample = spec.decode(data)
                stage = "transform"
                if spec.transform is not None:
                    sample = spec.transform(sample)
            fields = fields_of(item.key) if fields_of is not None else None
            label = item.label if target_field is None else fields.pop(target_field)
            target = label if spec.target_transform is None else spec.target_transform(label)
        except Exception as e:
            if job.skip:
                skipped.append((item.key, f"{type(e).__name__}: {e}"))
                continue
            return Failed(k, slot_id, stage, item.key, f"{type(e).__name__}: {e}", traceback.format_exc())
        samples.append((sample, target, fields) if fields else (sample, target))
        if served is not None:   # only samples the batch holds (a skipped one was never served)
            served.append((j, where, xxhash.xxh3_64_intdigest(data)))
        decode_s += clock() - t1
    if spec.fast is not None and spec.fast_defer:   # decoded on the device (load/fast_transform.py)
        collate = functools.partial(fast_transform.collate_deferred, collate=collate)
    elif spec.fast is not None:   # converted and normalized as one batch
        collate = functools.partial(fast_transform.collate_fast, spec.fast, collate=collate, uint8=spec.fast_uint8)
    return _collated(job, slots, spec, collate, samples, skipped, repaired, read_s, decode_s, served, source_s)


def _collated(job: Job, slots: list[Slot], spec: ReaderSpec, collate: Callable, samples: list, skipped: list,
              repaired: list, read_s: float, decode_s: float, served: list | None,
              source_s: float = 0.0) -> Loaded | Failed:
    """The batch's ``samples`` collated into its slot: what a reader answers (Failed where none is
    left or collation fails); ``source_s``: of the reading, the seconds spent on the source itself."""
    k, slot_id = job.batch, job.slot
    if not samples:
        return Failed(k, slot_id, "empty", job.items[0].key if job.items else "",
                      f"all {len(job.items)} samples of the batch were skipped", "")
    t0 = time.perf_counter()
    try:
        spec_, size, leaves = pack(collate(samples), slots[slot_id], digests=spec.digests)
    except Exception as e:
        return Failed(k, slot_id, "collate", job.items[0].key, f"{type(e).__name__}: {e}", traceback.format_exc())
    return Loaded(k, slot_id, spec_, size, skipped, repaired,
                  (read_s, decode_s, time.perf_counter() - t0, source_s), served, leaves)


def _load_made(job: Job, slots: list[Slot], spec: ReaderSpec, collate: Callable) -> Loaded | Failed:
    """A batch of a dataset with no files (source/indexed.py): each sample is what the dataset's
    ``__getitem__`` returns for its index (its own transforms applied there), collated as it is."""
    samples, skipped = [], []
    t0 = time.perf_counter()
    for item in job.items:
        try:
            samples.append(spec.source.item(item.key))
        except Exception as e:
            if job.skip:
                skipped.append((item.key, f"{type(e).__name__}: {e}"))
                continue
            return Failed(job.batch, job.slot, "getitem", item.key, f"{type(e).__name__}: {e}",
                          traceback.format_exc())
    return _collated(job, slots, spec, collate, samples, skipped, [], 0.0, time.perf_counter() - t0, None)
