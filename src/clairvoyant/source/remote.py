"""Object stores and web servers as a source, through fsspec: ``s3://``, ``gs://``, ``http(s)://``
and any other fsspec URL whose file system can list.

The prefix is listed once (the manifest persists the result, as for a directory); a sample is
one object, read with one ranged GET of the size the listing gave. A read is all or nothing:
fewer bytes than listed is retried, more means the source changed. Throttling (HTTP 503
SlowDown, 429), server errors and dropped connections are retried with exponential backoff and
jitter, bounded in count and in time; s3fs's and botocore's own retry loops are turned off so
that this one is the only one, and ``retries`` counts what it did.

The file system object is made lazily in each process (never shared across a fork: aiohttp's
sessions and fsspec's event loop belong to the process that made them) and is not pickled.
Credentials live in ``storage_options`` only: never in ``uri``, ``repr``, the manifest, error
messages or logs (the URL itself may not carry any).
"""

from __future__ import annotations

import asyncio
import bisect
import errno
import logging
import os
import random
import re
import time
from typing import Any, Callable, Iterator, TypeVar
from urllib.parse import urlsplit, urlunsplit

from ..errors import ConfigError, EmptySourceError, SampleReadError, SourceChanged, SourceError, SourceNotFound
from ..nodeio.forksafe import ForkSafeLock
from .base import Source

log = logging.getLogger("clairvoyant")
T = TypeVar("T")

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "http": "http", "https": "http"}
# storage_options whose values are not secret (everything else is kept out of messages)
_PUBLIC_OPTIONS = {"endpoint_url", "region_name", "region", "project", "anon", "use_ssl", "version_aware",
                   "requester_pays", "default_block_size", "cache_type", "signature_version", "addressing_style"}
_TRANSIENT_ERRNO = {errno.EAGAIN, errno.EBUSY, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNABORTED,
                    errno.ECONNREFUSED, errno.EPIPE, getattr(errno, "EREMOTEIO", 121)}
_TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}
_TRANSIENT_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests",
                    "ServiceUnavailable", "InternalError", "RequestTimeout", "503", "500"}
# client libraries' connection-level errors, by class name (none of them is imported here)
_TRANSIENT_NAMES = {"ClientPayloadError", "ServerDisconnectedError", "ClientConnectionError", "ClientOSError",
                    "ServerTimeoutError", "HTTPClientError", "EndpointConnectionError", "ConnectionClosedError",
                    "ReadTimeoutError", "ConnectTimeoutError", "IncompleteRead", "IncompleteReadError",
                    "ResponseParserError", "FSTimeoutError", "ProtocolError", "ChunkedEncodingError"}
_CLIENT_MODULES = ("aiohttp", "botocore", "aiobotocore", "s3fs", "gcsfs", "fsspec", "google", "requests",
                   "urllib3", "http.client")

_LOCK = ForkSafeLock()   # free in a forked child, whichever thread held it at the fork
_ABANDONED: list[Any] = []   # file systems made before a fork: never used nor finalized in the child


def is_url(obj: Any) -> bool:
    """A string with a URL scheme other than ``file://``."""
    m = _SCHEME.match(obj) if isinstance(obj, str) else None
    return m is not None and m.group(1).lower() != "file"


class _ShortRead(OSError):
    """Fewer bytes came than the listing gave: a dropped connection (retried)."""


class RemoteSource(Source):
    """The objects below ``url`` (``s3://bucket/prefix``, ``gs://...``, ``https://host/dir``...),
    each a sample keyed by its path relative to the prefix.

    Args:
        url: the prefix; no credentials in it (pass them in ``storage_options``).
        storage_options: keyword arguments of the fsspec file system (``key``, ``secret``,
            ``endpoint_url``, ``token``, ``client_kwargs``...).
        max_retries: retries of one read or listing before it fails.
        retry_timeout: seconds one read or listing may spend retrying (from its first failure).
        backoff: the first wait in seconds; each retry doubles it (up to 20 s), with jitter.
    """

    def __init__(self, url: str, storage_options: dict | None = None, *, max_retries: int = 10,
                 retry_timeout: float = 120.0, backoff: float = 0.1) -> None:
        if not is_url(url):
            raise ConfigError(f"{url!r} is not an object store URL: give scheme://bucket/prefix (s3://, gs://, "
                              "https://...)")
        if storage_options is not None and not isinstance(storage_options, dict):
            raise ConfigError("storage_options must be a dict of the fsspec file system's options")
        for name, value, low in (("max_retries", max_retries, 0), ("retry_timeout", retry_timeout, 0),
                                 ("backoff", backoff, 0)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
                raise ConfigError(f"{name} must be a number >= {low}, got {value!r}")
        parts = urlsplit(url)
        if parts.username is not None or parts.password is not None:
            raise ConfigError("the source URL carries credentials (user:password@): pass them in storage_options "
                              "instead, so that they stay out of the manifest, logs and messages")
        if parts.query or parts.fragment:
            raise ConfigError(f"{_public_url(url)}: a query or fragment in the source URL is not supported (a "
                              "token goes in storage_options, e.g. client_kwargs={'headers': {...}})")
        self._options = dict(storage_options or {})
        self._secrets = sorted(set(_secret_values(self._options)), key=len, reverse=True)
        self.protocol = parts.scheme.lower()
        self._cls = _filesystem_class(self.protocol)
        self._url_options = self._cls._get_kwargs_from_urls(url)
        self._root = self._cls._strip_protocol(url).rstrip("/")
        self.url = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        endpoint = self._options.get("endpoint_url") or (self._options.get("client_kwargs") or {}).get("endpoint_url")
        # the same bucket on another endpoint is another data set: its own manifest and cache
        self.uri = self.url + (f"?endpoint={_public_url(str(endpoint))}" if endpoint else "")
        self.max_retries, self.retry_timeout, self.backoff = int(max_retries), float(retry_timeout), float(backoff)
        self.retries = 0               # retries made by this process
        self._state: tuple[int, Any] | None = None   # (pid, file system)
        self._manifest: Any = None

    def __repr__(self) -> str:
        return f"RemoteSource({self.uri!r})"

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update(_state=None, _manifest=None, _cls=None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._cls = _filesystem_class(self.protocol)

    # -- the file system, one per process ------------------------------------------------------

    @property
    def fs(self) -> Any:
        """This process's file system object, made on first use."""
        pid, state = os.getpid(), self._state
        if state is not None and state[0] == pid:
            return state[1]
        with _LOCK:
            state = self._state
            if state is not None and state[0] == pid:
                return state[1]
            if state is not None:
                _ABANDONED.append(state[1])   # the parent's: its sessions are not ours to touch
            fs = self._make()
            self._state = (pid, fs)
            return fs

    def _make(self) -> Any:
        opts = {**self._url_options, **self._options}
        if self.protocol in ("s3", "s3a"):   # botocore retries nothing: our policy is the only one
            config = dict(opts.get("config_kwargs") or {})
            config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
            opts["config_kwargs"] = config
        try:
            fs = self._cls(skip_instance_cache=True, **opts)
        except Exception as e:   # a bad option: its message may hold the values
            raise ConfigError(f"cannot open {self.uri}: {type(e).__name__}: {self._redact(str(e))}; check "
                              "storage_options") from None
        if isinstance(getattr(type(fs), "retries", None), int):
            fs.retries = 1     # s3fs's and gcsfs's own retry loops: one attempt, we retry
        return fs

    # -- the Source interface ------------------------------------------------------------------

    def use_manifest(self, manifest: Any) -> None:
        """The sizes to expect: reads ask for exactly the listed bytes (the Loader calls this)."""
        self._manifest = manifest if getattr(manifest, "uri", None) == self.uri else None

    def scan(self) -> Iterator[tuple[str, int]]:
        """List the prefix (one recursive listing), yielding ``(key, size)`` in sorted key order;
        names with a component starting with "." are skipped, as directory markers are."""
        found = self._retrying(lambda fs: fs.find(self._root, detail=True, withdirs=False), None)
        prefix = self._root + "/"
        entries = []
        for name, info in found.items():
            if info.get("type") == "directory" or not name.startswith(prefix):
                continue
            key = name[len(prefix):]
            parts = key.split("/")
            if any(not p or p.startswith(".") for p in parts):
                continue
            size = info.get("size")
            if size is None:   # a web server's listing may not say: ask (one HEAD)
                size = self._retrying(lambda fs, n=name: fs.size(n), key)
            entries.append((key, int(size)))
        fs = self.fs
        fs.invalidate_cache()   # the listing stays in the manifest, not in the client's memory
        if not entries:
            raise EmptySourceError(f"data source {self.uri} holds no objects: check the URL (bucket and prefix) "
                                   "and that the credentials may list it")
        entries.sort()
        yield from entries

    def read(self, key: str) -> bytes:
        """The whole object ``key``: one ranged GET of the listed size (one more byte is asked
        for, to see a grown object); short reads are retried, never returned."""
        size = self._listed_size(key)
        path = self._path(key)

        def once(fs: Any) -> bytes:
            data = fs.cat_file(path) if not size else fs.cat_file(path, start=0, end=size + 1)
            if size is not None and len(data) != size:
                if len(data) < size:
                    raise _ShortRead(errno.EIO, f"got {len(data)} of the {size} bytes listed")
                raise SourceChanged(f"object {key!r} at {self.url}/{key} is larger than the {size} bytes listed "
                                    f"in the manifest: the source changed since it was indexed; run "
                                    f"`clairvoyant index --force {self.url}` or pass reindex=True")
            return data
        return self._retrying(once, key)

    def head(self, key: str) -> int:
        """The size of object ``key`` now: one metadata request (what ``clairvoyant probe`` times)."""
        path = self._path(key)

        def once(fs: Any) -> int:
            fs.invalidate_cache(path)   # a request, not the client's memory of a listing
            return int(fs.size(path))
        return self._retrying(once, key)

    # -- retries and errors --------------------------------------------------------------------

    def _retrying(self, op: Callable[[Any], T], key: str | None) -> T:
        start = 0.0    # the first failure: the retry budget counts from there
        attempt = 0
        while True:
            try:
                return op(self.fs)
            except SourceChanged:
                raise
            except Exception as e:   # noqa: BLE001 (classified below; anything else goes up as is)
                start = start or time.monotonic()
                if not transient(e):
                    if not _is_storage_error(e):
                        raise
                    raise self._failure(e, key, attempt, start, gave_up=False) from None
                delay = min(20.0, self.backoff * 2 ** attempt)
                delay = delay / 2 + random.uniform(0, delay / 2)   # jitter: threads do not retry in step
                left = self.retry_timeout - (time.monotonic() - start)
                if attempt >= self.max_retries or delay > left:
                    raise self._failure(e, key, attempt, start, gave_up=True) from None
                attempt += 1
                with _LOCK:
                    self.retries += 1
                log.debug("clairvoyant: %s, retry %d in %.2f s: %s", self._what(key), attempt, delay,
                          self._detail(e))
                time.sleep(delay)

    def _failure(self, e: BaseException, key: str | None, attempt: int, start: float, *,
                 gave_up: bool) -> SourceError:
        where, detail = self._what(key), self._detail(e)
        reindex = (f"the source changed since it was indexed; run `clairvoyant index --force {self.url}` "
                   "or pass reindex=True")
        if isinstance(e, FileNotFoundError):
            if key is None:
                return SourceNotFound(f"data source {self.uri} does not exist ({detail}): check the bucket and "
                                      "prefix")
            return SampleReadError(f"object {key!r} is gone from {self.url}/{key}: {reindex}")
        if isinstance(e, PermissionError):
            return _error(key, f"cannot read {where}: access denied ({detail}); check the credentials "
                               "(storage_options or the environment) and the bucket's policy")
        if gave_up:
            took = time.monotonic() - start
            if isinstance(e, _ShortRead):
                detail += f"; the object may be shorter than listed: if so, {reindex}"
            return _error(key, f"cannot read {where}: {detail}, still failing after {attempt} retries in "
                               f"{took:.1f} s: the store is throttling or unreachable; try again later, use fewer "
                               "stage_threads, or allow more (RemoteSource(url, max_retries=, retry_timeout=))")
        return _error(key, f"cannot read {where}: {detail}")

    def _what(self, key: str | None) -> str:
        return f"the listing of {self.url}" if key is None else f"object {key!r} at {self.url}/{key}"

    def _detail(self, e: BaseException) -> str:
        text = str(e) or "no message"
        return f"{type(e).__name__}: {self._redact(text)[:300]}"

    def _redact(self, text: str) -> str:
        for s in self._secrets:
            text = text.replace(s, "***")
        return text

    def _path(self, key: str) -> str:
        return f"{self._root}/{key}"

    def _listed_size(self, key: str) -> int | None:
        m = self._manifest
        if m is None:
            return None
        i = bisect.bisect_left(m.keys, key)
        return int(m.sizes[i]) if i < len(m) and m.keys[i] == key else None


def _error(key: str | None, message: str) -> SourceError:
    return SourceError(message) if key is None else SampleReadError(message)


def transient(e: BaseException | None) -> bool:
    """Whether ``e`` (or what caused it) is worth retrying: throttling, a server error, a dropped
    or timed-out connection. A missing object or a refusal is not."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
            return False
        if isinstance(e, (ConnectionError, TimeoutError, asyncio.TimeoutError, _ShortRead)):
            return True
        if isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNO:
            return True
        if any(c.__name__ in _TRANSIENT_NAMES for c in type(e).__mro__):
            return True
        status = getattr(e, "status", None) or getattr(e, "code", None)
        if isinstance(status, int) and status in _TRANSIENT_STATUS:
            return True
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            code = (response.get("Error") or {}).get("Code")
            http = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if code in _TRANSIENT_CODES or http in _TRANSIENT_STATUS:
                return True
        e = e.__cause__ or e.__context__
    return False


def _is_storage_error(e: BaseException) -> bool:
    return isinstance(e, OSError) or any(c.__module__.startswith(_CLIENT_MODULES) for c in type(e).__mro__)


def _filesystem_class(protocol: str) -> Any:
    extra = _EXTRAS.get(protocol)
    hint = f"pip install 'clairvoyant[{extra}]'" if extra else "install the fsspec implementation of it"
    try:
        import fsspec
        return fsspec.get_filesystem_class(protocol)
    except ImportError as e:
        raise ConfigError(f"reading {protocol}:// URLs needs fsspec and its {protocol} file system ({e}): "
                          f"{hint}") from None
    except ValueError:
        raise ConfigError(f"fsspec knows no {protocol}:// file system: check the URL's scheme") from None


def _secret_values(options: Any, name: str = "") -> list[str]:
    """Every string in ``options`` not known to be public (keys, secrets, tokens, headers...)."""
    if isinstance(options, dict):
        return [s for k, v in options.items() if str(k) not in _PUBLIC_OPTIONS for s in _secret_values(v, str(k))]
    if isinstance(options, (list, tuple)):
        return [s for v in options for s in _secret_values(v, name)]
    return [options] if isinstance(options, str) and len(options) >= 4 else []


def _public_url(url: str) -> str:
    """``url`` without user, password, query or fragment."""
    p = urlsplit(url)
    host = p.hostname or ""
    if p.port is not None:
        host += f":{p.port}"
    return urlunsplit((p.scheme, host, p.path.rstrip("/"), "", ""))
