"""Object stores through fsspec, against a real S3-compatible server (moto) on 127.0.0.1, behind a
fault-injecting proxy (clairvoyant.testing.s3faults): the same batches as the local directory,
one listing, throttling and cut connections retried without a partial sample, typed errors, no
credential anywhere, `clairvoyant probe s3://...`."""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing as mp
import os
import pickle
import traceback

import numpy as np
import pytest

pytest.importorskip("s3fs", reason="the object-store tests need s3fs: pip install -e '.[test]'")
moto_server = pytest.importorskip("moto.server", reason="the object-store tests need moto[server]: "
                                                        "pip install -e '.[test]'")

from clairvoyant import Loader  # noqa: E402
from clairvoyant.cli.main import main  # noqa: E402
from clairvoyant.errors import SampleReadError, SourceChanged, SourceError  # noqa: E402
from clairvoyant.source import RemoteSource, as_source  # noqa: E402
from clairvoyant.testing.s3faults import FaultProxy  # noqa: E402

BUCKET = "cvbucket"
KEY_ID = "AKIACVKEYID7Q3W"                     # moto takes any credentials
SECRET = "cv-secret-4b1d9e7f2a6c"              # must never show up anywhere


@pytest.fixture(scope="session")
def offline_env():
    """Dummy credentials, no metadata service, no proxy, no config files: nothing leaves 127.0.0.1."""
    with pytest.MonkeyPatch.context() as mp_:
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy",
                     "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
            mp_.delenv(name, raising=False)
        mp_.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp_.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp_.setenv("AWS_DEFAULT_REGION", "us-east-1")
        mp_.setenv("AWS_EC2_METADATA_DISABLED", "true")
        mp_.setenv("AWS_CONFIG_FILE", os.devnull)
        mp_.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
        mp_.setenv("NO_PROXY", "127.0.0.1,localhost")
        logging.getLogger("werkzeug").setLevel(logging.ERROR)   # moto's request log
        yield


@pytest.fixture(scope="session")
def moto(offline_env):
    """A moto S3 server on 127.0.0.1 (a free port), stopped at the end of the session."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"{host}:{port}"
    server.stop()


@pytest.fixture(scope="session")
def direct(moto):
    """An s3fs client straight to moto (no proxy): uploads and changes behind the source's back."""
    import s3fs
    return s3fs.S3FileSystem(endpoint_url=f"http://{moto}", key="testing", secret="testing",
                             skip_instance_cache=True)


@pytest.fixture(scope="session")
def bucket(direct, dataset):
    """The conftest data set (96 JPEGs, 4 classes; a hidden marker file) at s3://BUCKET/imgs, plus
    hidden objects and a sibling prefix that must not be listed."""
    direct.mkdir(BUCKET)
    direct.put(dataset.rstrip("/") + "/", f"{BUCKET}/imgs/", recursive=True)
    direct.pipe({f"{BUCKET}/imgs/.cache/x.jpg": b"hidden", f"{BUCKET}/imgs/class_0000/.DS_Store": b"mac",
                 f"{BUCKET}/imgs-extra/class_0000/y.jpg": b"sibling"})
    return f"s3://{BUCKET}/imgs"


@pytest.fixture(scope="session")
def _proxy(moto):
    with FaultProxy(moto, max_connections=32) as p:
        yield p


@pytest.fixture
def proxy(_proxy):
    """The proxy, counts zeroed and faults off (a small latency per request, as a remote store has)."""
    _proxy.configure(latency=0.001, slowdown_every=0, cut_every=0)
    _proxy.reset()
    yield _proxy
    _proxy.configure(latency=0.0, slowdown_every=0, cut_every=0)


def options(proxy: FaultProxy) -> dict:
    return {"endpoint_url": proxy.endpoint, "key": KEY_ID, "secret": SECRET}


def source(proxy: FaultProxy, url: str, **kw) -> RemoteSource:
    kw.setdefault("backoff", 0.005)
    return RemoteSource(url, options(proxy), **kw)


def batches(loader: Loader) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(np.asarray(x), np.asarray(y)) for x, y in loader]


def same(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(xa, xb) and np.array_equal(ya, yb)
                                    for (xa, ya), (xb, yb) in zip(a, b))


def local_batches(dataset: str, tmp_path, seed: int) -> list:
    with Loader(dataset, batch_size=10, seed=seed, local_dir=tmp_path / f"posix{seed}", num_workers=1,
                output="numpy") as ld:
        return batches(ld)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def scratch(direct, name: str, objects: dict[str, bytes]) -> str:
    """A prefix of its own for a test that changes objects."""
    direct.pipe({f"{BUCKET}/{name}/{k}": v for k, v in objects.items()})
    return f"s3://{BUCKET}/{name}"


# -- the data -----------------------------------------------------------------------------------------

def test_loader_over_s3_gives_the_batches_of_the_local_directory(bucket, dataset, proxy, tmp_path, no_leaks):
    with Loader(bucket, batch_size=10, seed=3, local_dir=tmp_path / "s3", num_workers=2, output="numpy",
                storage_options=options(proxy)) as ld:
        assert isinstance(ld.source, RemoteSource)
        assert ld.manifest.classes == ("class_0000", "class_0001", "class_0002", "class_0003")
        assert len(ld.manifest) == 96   # hidden names and the sibling prefix are not samples
        remote = batches(ld)
    expected = local_batches(dataset, tmp_path, seed=3)
    assert same(remote, expected)
    assert proxy.counts["get"] >= 96
    # negative control: another seed gives other batches
    assert not same(remote, local_batches(dataset, tmp_path, seed=4))


def test_the_prefix_is_listed_once_then_the_manifest_is_used(bucket, proxy, tmp_path, no_leaks):
    kw = dict(batch_size=32, local_dir=tmp_path / "l", num_workers=1, output="numpy", storage_options=options(proxy))
    with Loader(bucket, **kw) as first:
        assert first.indexed and len(first.manifest) == 96
        assert len(batches(first)) == 3
    assert proxy.counts["list"] >= 1
    proxy.reset()
    with Loader(bucket, **kw) as second:
        assert not second.indexed
        assert second.manifest.keys == first.manifest.keys
        assert len(batches(second)) == 3
    assert proxy.counts["list"] == 0 and proxy.counts["get"] == 0   # listed nothing; every sample was staged
    # negative control: reindex=True lists again, and the proxy sees it
    with Loader(bucket, reindex=True, **kw) as third:
        assert third.indexed
    assert proxy.counts["list"] >= 1


# -- faults ---------------------------------------------------------------------------------------------

def test_slowdown_is_retried_with_backoff_and_the_data_is_the_same(bucket, dataset, proxy, tmp_path, no_leaks):
    src = source(proxy, bucket)
    proxy.configure(slowdown_every=3)
    with Loader(src, batch_size=10, seed=5, local_dir=tmp_path / "s3", num_workers=1, output="numpy") as ld:
        remote = batches(ld)
    assert proxy.counts["slowdowns"] >= 96 // 3
    assert 1 <= src.retries <= proxy.counts["slowdowns"]   # counted where they happen (here: staging threads)
    assert same(remote, local_batches(dataset, tmp_path, seed=5))
    # one retry per 503, exactly, on reads in this process
    proxy.reset()
    direct_src = source(proxy, bucket)
    keys = [k for k, _ in direct_src.scan()][:12]
    for key in keys:
        with open(os.path.join(dataset, key), "rb") as f:
            assert direct_src.read(key) == f.read()
    assert proxy.counts["slowdowns"] >= 4 and direct_src.retries == proxy.counts["slowdowns"]
    # negative control: with no retries allowed, the same throttling fails, typed and explained
    proxy.reset()
    strict = source(proxy, bucket, max_retries=0)
    keys = [k for k, _ in strict.scan()]
    with pytest.raises(SampleReadError) as err:
        for key in keys[:3]:
            strict.read(key)
    assert "throttling" in str(err.value) and f"{bucket}/" in str(err.value) and "max_retries" in str(err.value)
    assert strict.retries == 0


def test_the_retry_budget_bounds_the_time(bucket, proxy):
    proxy.configure(slowdown_every=1)   # every GET throttled
    src = source(proxy, bucket, max_retries=1000, retry_timeout=0.3, backoff=0.02)
    key = "class_0000/img_0000000.jpg"
    with pytest.raises(SampleReadError, match="still failing after"):
        src.read(key)
    assert 1 <= src.retries < 50


def test_a_cut_connection_is_retried_and_no_partial_sample_is_served(bucket, dataset, proxy, tmp_path, no_leaks):
    src = source(proxy, bucket)
    listed = dict(src.scan())
    from clairvoyant.manifest import build
    src.use_manifest(build(src))
    proxy.configure(cut_every=3)
    for key, size in listed.items():
        data = src.read(key)
        with open(os.path.join(dataset, key), "rb") as f:
            want = f.read()
        assert len(data) == size == len(want) and sha(data) == sha(want), key
    assert proxy.counts["cuts"] >= len(listed) // 3 and src.retries >= proxy.counts["cuts"]
    # end to end: a Loader through such faults gives the local batches
    proxy.configure(cut_every=5)
    with Loader(source(proxy, bucket), batch_size=10, seed=7, local_dir=tmp_path / "s3", num_workers=1,
                output="numpy") as ld:
        assert same(batches(ld), local_batches(dataset, tmp_path, seed=7))
    # negative control: without retries a cut read raises; it never returns the bytes that came
    proxy.configure(cut_every=1)
    strict = source(proxy, bucket, max_retries=0)
    strict.use_manifest(ld.manifest)
    with pytest.raises(SampleReadError, match="class_0001/img_0000001.jpg"):
        strict.read("class_0001/img_0000001.jpg")


def test_an_object_that_changed_size_is_never_served(direct, proxy):
    url = scratch(direct, "changing", {"a.bin": b"x" * 100, "b.bin": b"y" * 100})
    src = source(proxy, url, max_retries=2)
    from clairvoyant.manifest import build
    src.use_manifest(build(src))
    assert src.read("a.bin") == b"x" * 100   # control: as listed, it reads
    direct.pipe({f"{BUCKET}/changing/a.bin": b"x" * 50, f"{BUCKET}/changing/b.bin": b"y" * 150})
    with pytest.raises(SampleReadError, match=r"'a.bin'.*reindex"):
        src.read("a.bin")    # shorter: retried (a drop looks the same), then an error, never 50 bytes
    with pytest.raises(SourceChanged, match=r"'b.bin'.*larger than the 100 bytes"):
        src.read("b.bin")


def test_a_missing_object_is_a_typed_error_naming_the_key(direct, proxy, tmp_path, no_leaks):
    url = scratch(direct, "missing", {f"c{i % 2}/{i}.bin": bytes([i]) * 64 for i in range(8)})
    with Loader(url, batch_size=4, shuffle=False, local_dir=tmp_path / "a", num_workers=1, output="numpy",
                decode=lambda b: np.frombuffer(b, np.uint8), storage_options=options(proxy)) as ld:
        assert len(batches(ld)) == 2       # control: while the object is there, all of it loads
    direct.rm(f"{BUCKET}/missing/c1/3.bin")
    src = source(proxy, url)
    with pytest.raises(SampleReadError, match=r"'c1/3.bin' is gone from s3://cvbucket/missing/c1/3.bin.*reindex"):
        src.read("c1/3.bin")
    assert src.retries == 0                # a missing object is not retried
    with Loader(url, batch_size=4, shuffle=False, local_dir=tmp_path / "b", num_workers=1, output="numpy",
                decode=lambda b: np.frombuffer(b, np.uint8), storage_options=options(proxy)) as ld:
        with pytest.raises(SampleReadError, match="c1/3.bin"):
            batches(ld)
    with pytest.raises(SourceError, match="holds no objects"):
        list(source(proxy, f"s3://{BUCKET}/no-such-prefix").scan())


def test_the_source_pickles_without_its_file_system_and_reads_after_a_fork(bucket, dataset, proxy):
    src = source(proxy, bucket)
    key = "class_0002/img_0000002.jpg"
    parent_fs = src.fs
    assert src.read(key)                     # the parent's client is live when the child forks
    clone = pickle.loads(pickle.dumps(src))
    assert clone._state is None and clone.uri == src.uri
    ctx = mp.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_read_in_child, args=(src, key, send))   # inherited, not pickled
    child.start()
    assert receive.poll(30), "the forked reader did not answer"
    got = receive.recv()
    child.join(10)
    assert child.exitcode == 0
    with open(os.path.join(dataset, key), "rb") as f:
        want = sha(f.read())
    digest, inherited_refused, own_client = got
    assert digest == want and own_client
    assert src.fs is parent_fs and sha(src.read(key)) == want   # the parent's client still works
    # negative control: the client inherited through the fork is unusable in the child
    assert inherited_refused


def _read_in_child(src: RemoteSource, key: str, send) -> None:
    inherited = src._state[1]
    try:
        inherited.cat_file(f"{src._root}/{key}")
        refused = False
    except RuntimeError as e:   # fsspec: "This class is not fork-safe"
        refused = "fork" in str(e)
    data = src.read(key)
    send.send((sha(data), refused, src._state[0] == os.getpid() and src._state[1] is not inherited))


# -- credentials ----------------------------------------------------------------------------------------

def test_credentials_never_leak(bucket, direct, proxy, tmp_path, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    src = as_source(bucket, options(proxy))
    seen += [repr(src), src.uri, str(src.__dict__.get("url"))]
    with Loader(bucket, batch_size=32, local_dir=tmp_path / "l", num_workers=1, output="numpy",
                storage_options=options(proxy)) as ld:
        batches(ld)
        seen.append(json.dumps(ld.stats(), default=str))
    for root in (tmp_path / "l", os.environ["CLAIRVOYANT_CACHE"]):   # the manifest, the cache
        for d, _, files in os.walk(root):
            for name in files:
                with open(os.path.join(d, name), "rb") as f:
                    seen.append(f.read().decode("latin-1"))
    assert any("class_0000/img_0000000.jpg" in s for s in seen)   # the manifest is among them
    errors = []
    url = scratch(direct, "leak", {"a.bin": b"a" * 10})
    proxy.configure(slowdown_every=1)
    for op in (lambda: source(proxy, url, max_retries=1).read("a.bin"),
               lambda: source(proxy, url).read("gone.bin"),
               lambda: list(source(proxy, "s3://no-such-bucket-cv/x").scan())):
        with pytest.raises(SourceError) as err:
            op()
        errors.append("".join(traceback.format_exception(err.value)))
    proxy.configure(slowdown_every=0)
    seen += errors
    code = main(["probe", bucket, "--storage-options", json.dumps(options(proxy)), "--readers", "1",
                 "--seconds", "0.1", "--json"])
    assert code == 0
    out = capsys.readouterr()
    seen += [out.out, out.err] + [r.getMessage() for r in caplog.records if r.name.startswith("clairvoyant")]
    ours = "\n".join(seen)
    # every library's debug log too (botocore's names the key id in the Authorization header: not ours)
    everything = "\n".join([ours, caplog.text] + [repr(r.args) for r in caplog.records])
    assert SECRET not in everything
    assert KEY_ID not in ours
    # negative control: the search finds a secret where there is one
    assert SECRET in everything + repr(options(proxy)) and KEY_ID in ours + json.dumps(options(proxy))


def test_a_url_with_credentials_or_options_without_a_url_are_refused(dataset):
    from clairvoyant.errors import ConfigError
    with pytest.raises(ConfigError, match="storage_options") as err:
        RemoteSource(f"https://user:{SECRET}@example.invalid/data")
    assert SECRET not in str(err.value)
    with pytest.raises(ConfigError, match="not an object store URL"):
        Loader(dataset, storage_options={"anon": True})
    assert RemoteSource(f"s3://{BUCKET}/imgs/").uri == f"s3://{BUCKET}/imgs"   # control: a clean URL is taken


# -- the probe ------------------------------------------------------------------------------------------

def test_probe_measures_an_s3_prefix(bucket, proxy, capsys):
    opts = json.dumps({"endpoint_url": proxy.endpoint})
    code = main(["probe", bucket, "--storage-options", opts, "--readers", "1,4", "--seconds", "0.2", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    res = json.loads(out)
    assert res["samples"] == 96 and res["uri"].startswith(bucket + "?endpoint=")
    assert [p["readers"] for p in res["curve"]] == [1, 4] and all(p["files_per_s"] > 0 for p in res["curve"])
    assert res["stat_s"]["p50"] > 0 and proxy.counts["head"] >= 1   # metadata: HEAD requests
    # negative control: a prefix with nothing under it is an error, not a measurement
    assert main(["probe", f"s3://{BUCKET}/nothing-here", "--storage-options", opts, "--json"]) == 2
    assert "holds no objects" in capsys.readouterr().err
