"""A fault-injecting HTTP proxy for an S3-compatible server on the loopback address.

Clients talk to the proxy's ``endpoint`` as they would to the server. It forwards each request
(one upstream connection per request), and on the way can add a latency per request, answer
every k-th object GET with ``503 SlowDown`` (the S3 error document), or cut the connection after
sending part of every m-th object GET's body (the headers announce the whole length). It counts
what it saw: requests, LISTs, object GETs, the 503s and cuts it injected. Connections served at
once are bounded; every thread is a daemon and ``stop`` ends them.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection", "te", "trailer",
        "upgrade"}
SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
            b"<Message>Please reduce your request rate.</Message><RequestId>cvfault</RequestId></Error>")


class FaultProxy:
    """A forwarding proxy from ``endpoint`` (127.0.0.1, a free port) to ``upstream`` (``host:port``).

    Args:
        latency: seconds added before each request is forwarded.
        slowdown_every: answer every k-th object GET with 503 SlowDown (0: never).
        cut_every: send only ``cut_fraction`` of every m-th object GET's body, then close (0: never).
        max_connections: connections served at once; more wait to be accepted.
    """

    def __init__(self, upstream: str, *, latency: float = 0.0, slowdown_every: int = 0, cut_every: int = 0,
                 cut_fraction: float = 0.5, max_connections: int = 32) -> None:
        self.upstream = upstream
        self.latency, self.slowdown_every, self.cut_every = float(latency), int(slowdown_every), int(cut_every)
        self.cut_fraction = float(cut_fraction)
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_connections)
        self._server = _Server(("127.0.0.1", 0), _Handler, self)
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def configure(self, **faults: float) -> None:
        """Change ``latency``, ``slowdown_every``, ``cut_every`` or ``cut_fraction`` from now on."""
        with self.lock:
            for name, value in faults.items():
                if name not in ("latency", "slowdown_every", "cut_every", "cut_fraction"):
                    raise TypeError(f"unknown fault {name!r}")
                setattr(self, name, type(getattr(self, name))(value))

    def reset(self) -> None:
        """Zero the counts (and the k-th/m-th GET counting)."""
        with self.lock:
            self.counts.clear()

    def start(self) -> "FaultProxy":
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="s3faults-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _decide(self, kind: str) -> str:
        """Count a request of ``kind`` and say what to do with it: forward, slowdown or cut."""
        with self.lock:
            self.counts["requests"] += 1
            self.counts[kind] += 1
            if kind != "get":
                return "forward"
            n = self.counts["get"]
            if self.slowdown_every and n % self.slowdown_every == 0:
                self.counts["slowdowns"] += 1
                return "slowdown"
            if self.cut_every and n % self.cut_every == 0:
                self.counts["cuts"] += 1
                return "cut"
            return "forward"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, addr: tuple[str, int], handler: type, proxy: FaultProxy) -> None:
        self.proxy = proxy
        super().__init__(addr, handler)

    def process_request(self, request, client_address) -> None:
        self.proxy._slots.acquire()   # bounded: the accept loop waits for a free slot
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.proxy._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.proxy._slots.release()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:   # quiet
        pass

    def _kind(self) -> str:
        parts = urlsplit(self.path)
        query = parse_qs(parts.query, keep_blank_values=True)
        segments = [s for s in parts.path.split("/") if s]
        if self.command == "GET" and ("list-type" in query or "prefix" in query or "delimiter" in query
                                      or len(segments) < 2):
            return "list"
        if self.command == "GET":
            return "get"
        return self.command.lower()

    def _handle(self) -> None:
        proxy = self.server.proxy
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else None
        action = proxy._decide(self._kind())
        if proxy.latency:
            time.sleep(proxy.latency)
        if action == "slowdown":
            self.send_response(503, "Slow Down")
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(SLOWDOWN)))
            self.end_headers()
            self.wfile.write(SLOWDOWN)
            return
        host, _, port = proxy.upstream.rpartition(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            self.send_response(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in _HOP:
                    self.send_header(k, v)
            length = resp.getheader("Content-Length") if self.command == "HEAD" else str(len(data))
            if length is not None:
                self.send_header("Content-Length", length)
            self.end_headers()
            if self.command == "HEAD":
                return
            if action == "cut":
                self.wfile.write(data[:int(len(data) * proxy.cut_fraction)])
                self.wfile.flush()
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return
            self.wfile.write(data)
        finally:
            conn.close()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle
