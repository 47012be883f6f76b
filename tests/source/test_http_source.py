"""A web server as the source (``http://``, through fsspec and aiohttp): Python's own http.server
on 127.0.0.1 serving a data set's directory, its index pages listed by fsspec. Every sample comes
with the served bytes, the second epoch asks the server for nothing (the local tier holds the
files), and a file gone from the server is a typed error that names it. Each check has a control."""

from __future__ import annotations

import collections
import hashlib
import http.server
import os
import re
import threading
from functools import partial

import numpy as np
import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("fsspec")

from clairvoyant import Loader  # noqa: E402
from clairvoyant.errors import SourceError  # noqa: E402
from clairvoyant.source import RemoteSource, as_source  # noqa: E402
from clairvoyant.testing import make_dataset  # noqa: E402


class _Handler(http.server.SimpleHTTPRequestHandler):
    gets: collections.Counter   # path -> GETs of files (not index pages), set per server

    def do_GET(self):  # noqa: N802 - http.server's name
        if not self.path.endswith("/"):
            self.gets[self.path] += 1
        super().do_GET()

    def log_message(self, *args):   # quiet
        pass


@pytest.fixture
def server(tmp_path, monkeypatch):
    """(URL of the data set, its directory, the Counter of file GETs): 30 JPEGs in 3 classes."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    root = tmp_path / "www"
    data = make_dataset(str(root / "imgs"), 30, num_classes=3, size=32)
    gets: collections.Counter = collections.Counter()
    handler = type("Handler", (_Handler,), {"gets": gets})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(root)))
    t = threading.Thread(target=httpd.serve_forever, name="test-http", daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/imgs", data, gets
    finally:
        httpd.shutdown()
        httpd.server_close()
        t.join(5)


def md5(b: bytes) -> np.ndarray:
    return np.frombuffer(hashlib.md5(b).digest(), dtype=np.uint8).copy()


def _md5_of(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.md5(f.read()).hexdigest()


def truth(root: str) -> collections.Counter:
    return collections.Counter(_md5_of(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs
                               if not f.startswith("."))


def epoch_digests(ld: Loader) -> collections.Counter:
    return collections.Counter(bytes(row).hex() for x, _ in ld for row in np.asarray(x))


def test_a_loader_over_http_serves_the_servers_bytes_and_a_second_epoch_from_the_tier(server, tmp_path, no_leaks):
    url, data, gets = server
    assert isinstance(as_source(url), RemoteSource)
    ld = Loader(url, batch_size=4, local_dir=str(tmp_path / "local"), decode=md5, output="numpy",
                num_workers=1, cluster=False, seed=3)
    try:
        assert len(ld.manifest) == 30
        want = truth(data)
        got = []
        for e in range(2):
            before = sum(gets.values())
            ld.set_epoch(e)
            got.append(epoch_digests(ld))
            got.append(sum(gets.values()) - before)
        first, first_gets, second, second_gets = got
        assert first == want and second == want
        assert first_gets == 30, gets   # each file asked for once
        assert second_gets == 0, gets   # all of them from the local tier
        # control: the comparison sees a sample with other bytes
        wrong = collections.Counter(first)
        wrong[next(iter(wrong))] -= 1
        wrong["0" * 32] += 1
        assert wrong != want
    finally:
        ld.close()


def test_a_file_gone_from_the_server_is_a_typed_error_naming_it(server, tmp_path, no_leaks):
    url, data, gets = server
    ld = Loader(url, batch_size=4, local_dir=str(tmp_path / "local"), decode=md5, output="numpy",
                num_workers=1, cluster=False, shuffle=False)
    gone = ld.manifest.keys[5]
    path = os.path.join(data, gone)
    with open(path, "rb") as f:
        kept = f.read()
    os.remove(path)   # after the listing: the server now answers 404
    try:
        with pytest.raises(SourceError, match=re.escape(gone)):
            for _ in ld:
                pass
    finally:
        ld.close()
    # control: the same listing with the file still there reads through
    with open(path, "wb") as f:   # back, the same bytes
        f.write(kept)
    ld = Loader(url, batch_size=4, local_dir=str(tmp_path / "local2"), decode=md5, output="numpy",
                num_workers=1, cluster=False, shuffle=False)
    try:
        assert epoch_digests(ld) == truth(data)
    finally:
        ld.close()
