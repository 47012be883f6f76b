"""MECHANISM: the job's secret, from which every rank's CURVE keys come (cluster/wire_zmq.py), and
where it comes from.

The peers of a job prove to each other that they belong to it: each rank's key pair is derived
from one secret of the job and its rank (:func:`rank_keys`), so every rank knows every other
rank's public key without an exchange, a connection is admitted only with one of them, and the
rank it speaks for is the one its key belongs to. Where the secret comes from (:func:`job_secret`),
the first that applies, said once in the log (the secret itself never: not in a log, a manifest,
an error or ``stats()``):

1. ``CLAIRVOYANT_JOB_SECRET`` (the secret, at least 16 characters) or
   ``CLAIRVOYANT_JOB_SECRET_FILE`` (a file holding it: keep it 0600);
2. a secret file in the user's home, ``$XDG_CONFIG_HOME/clairvoyant/job-secret`` (by default
   ``~/.config``), drawn once and created 0600. Homes are shared across a cluster's nodes, so
   every rank of every job of the user reads the same one; it comes before a secret drawn per
   launch because the mounts' services outlive their launcher and are taken over by the next
   launch's members with the keys they have;
3. drawn by rank 0 and handed to the others through the launcher's rendezvous: MPI's
   collectives, or torch.distributed's store, with a warning that it is then only as private as
   that store (which has no authentication of its own).

The ranks check that they hold the same secret (a keyed digest of it is gathered, not the
secret); where the home files differ (homes not shared) the secret is drawn and handed over as
in 3. ``CLAIRVOYANT_PEER_AUTH=off`` turns it all off (any process that reaches a port then reads
the job's samples), with a warning at every start.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from typing import Mapping, NamedTuple

from ..errors import ConfigError

log = logging.getLogger("clairvoyant")
SECRET_VAR, SECRET_FILE_VAR, AUTH_VAR = "CLAIRVOYANT_JOB_SECRET", "CLAIRVOYANT_JOB_SECRET_FILE", "CLAIRVOYANT_PEER_AUTH"
MIN_LENGTH = 16


class JobSecret(NamedTuple):
    """The secret's bytes and where they came from (for the log; never the bytes)."""

    key: bytes
    where: str

    def __repr__(self) -> str:   # never the bytes, wherever the tuple is printed
        return f"JobSecret(from {self.where})"

    def digest(self, purpose: bytes) -> bytes:
        """32 bytes of the secret for ``purpose`` (they tell nothing of it)."""
        return hashlib.blake2b(purpose, key=hashlib.sha256(self.key).digest(), digest_size=32).digest()


def auth_off(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``CLAIRVOYANT_PEER_AUTH=off`` turned authentication off (any other value but "on",
    "1" or unset: a ConfigError)."""
    raw = (os.environ if env is None else env).get(AUTH_VAR, "on").strip().lower()
    if raw in ("off", "0", "no", "false"):
        return True
    if raw in ("on", "1", "yes", "true", ""):
        return False
    raise ConfigError(f"{AUTH_VAR}={raw!r}: give 'on' (the default) or 'off'")


def from_environment(env: Mapping[str, str] | None = None) -> JobSecret | None:
    """The secret ``CLAIRVOYANT_JOB_SECRET`` or the file ``CLAIRVOYANT_JOB_SECRET_FILE`` names, or None."""
    env = os.environ if env is None else env
    raw, where = (env.get(SECRET_VAR) or "").encode(), SECRET_VAR
    if not raw and env.get(SECRET_FILE_VAR):
        path = env[SECRET_FILE_VAR]
        try:
            with open(path, "rb") as f:
                mode = os.fstat(f.fileno()).st_mode
                raw = f.read().strip()   # (its bytes as they are: a binary secret keeps its entropy)
        except OSError as e:
            raise ConfigError(f"{SECRET_FILE_VAR}={path}: cannot read it ({e.strerror}); give a readable file "
                              "holding the job's secret, or unset it") from None
        if mode & 0o077:
            raise ConfigError(f"{SECRET_FILE_VAR}={path} may be read by others (mode {mode & 0o777:o}): "
                              f"`chmod 600 {path}`")
        where = f"{SECRET_FILE_VAR} ({path})"
    if not raw:
        return None
    if len(raw) < MIN_LENGTH:
        raise ConfigError(f"{where}: the job's secret has {len(raw)} bytes; give at least {MIN_LENGTH} "
                          "(e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`)")
    return JobSecret(raw, where)


def home_file(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "clairvoyant", "job-secret")


def from_home(env: Mapping[str, str] | None = None) -> JobSecret | None:
    """The user's secret file (created 0600 if absent), or None where it can be neither read nor
    made. A file others may read is refused: a ConfigError that says how to fix it."""
    path = home_file(env)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            if not _create(path):
                return None
            continue
        except OSError as e:
            log.info("clairvoyant: the secret file %s cannot be read (%s)", path, e.strerror)
            return None
        try:
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_mode & 0o077:
                    raise ConfigError(f"the job secret file {path} may be read by others (mode "
                                      f"{st.st_mode & 0o777:o}): `chmod 600 {path}`, or remove it and a new one is drawn")
                raw = f.read().strip()
        except OSError as e:   # a directory there, an I/O error: said on every rank (job_secret)
            raise ConfigError(f"the job secret file {path} cannot be read ({e.strerror}); remove it and a new one "
                              f"is drawn, or set {SECRET_VAR}") from None
        if len(raw) >= MIN_LENGTH:
            return JobSecret(raw, f"the secret file {path}")
        log.warning("clairvoyant: the secret file %s is shorter than %d bytes; not used", path, MIN_LENGTH)
        return None
    return None


def _create(path: str) -> bool:
    """Draw a secret into ``path`` (0600, whole or not at all: written aside, then linked in, so
    that ranks starting together all read the one that won)."""
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_hex(32).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass   # another rank's came first: it is the one read
        return True
    except OSError as e:
        log.info("clairvoyant: no secret file can be made at %s (%s)", path, e.strerror)
        return False
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def job_secret(group, env: Mapping[str, str] | None = None) -> JobSecret | None:
    """The job's secret, the same on every rank of ``group`` (collective; module docstring), or
    None where ``CLAIRVOYANT_PEER_AUTH=off`` (warned)."""
    error = None
    try:   # (a rank's error is said to every rank after the gather: none waits for it)
        off = auth_off(env)
        got = None if off else (from_environment(env) or from_home(env))
    except ConfigError as e:
        error, off, got = e, False, None
    mine = b"!" if error is not None else b"off" if off else b"" if got is None else \
        (b"E" if got.where.startswith(SECRET_VAR) else b"H") + got.digest(b"clairvoyant job secret check")
    digests = group.allgather(mine, "the check that every rank holds the job's secret")
    failed = [r for r, d in enumerate(digests) if d == b"!"]
    if failed:
        raise error if error is not None else ConfigError(
            f"rank(s) {failed} could not take the job's secret (their error says why); fix it there, or set "
            f"{SECRET_VAR} alike on every rank")
    if any(d == b"off" for d in digests) and not all(d == b"off" for d in digests):
        raise ConfigError(f"{AUTH_VAR}=off on rank(s) {[r for r, d in enumerate(digests) if d == b'off']} only, of "
                          f"{group.size}: set it alike on every rank")
    if off:
        if group.rank == 0:
            log.warning("clairvoyant: %s=off: the peers of this job are NOT authenticated nor encrypted: any process "
                        "that reaches their ports reads the job's samples (docs/security.md)", AUTH_VAR)
        return None
    if mine and all(d == mine for d in digests):
        if group.rank == 0:
            log.info("clairvoyant: the peers authenticate with the job's secret from %s", got.where)
        return got
    given = [r for r, d in enumerate(digests) if d.startswith(b"E")]   # (every rank decides alike)
    if given:
        raise ConfigError(f"{SECRET_VAR} (or {SECRET_FILE_VAR}) is not the same on every rank: rank(s) {given} "
                          f"have one, of {len(set(digests[r] for r in given))} kind(s), out of {group.size}; give every "
                          "rank the same secret, or unset it on all of them")
    drawn = secrets.token_bytes(32) if group.rank == 0 else b""
    key = group.allgather(drawn, "the hand-over of the job's secret")[0]
    if len(key) != 32:
        raise ConfigError("rank 0 handed over no job secret; start every rank with the same clairvoyant")
    where = f"drawn by rank 0 and handed over through {group.name}"
    if group.rank == 0:
        if group.name == "MPI":
            log.info("clairvoyant: the peers authenticate with a secret %s", where)
        else:
            log.warning("clairvoyant: the peers authenticate with a secret %s, which has no authentication of its "
                        "own: the secret is only as private as that store. Set %s (or let the home directory hold "
                        "%s) to keep it out of it", where, SECRET_VAR, home_file(env))
    return JobSecret(key, where)


def key_id(secret: JobSecret | None) -> str:
    """What a process may say of the keys it holds (a digest of the secret, telling nothing of
    it; "off" for none): two with the same id hold the same keys."""
    return "off" if secret is None else secret.digest(b"clairvoyant key id").hex()


def rank_keys(secret: JobSecret, rank: int) -> tuple[bytes, bytes]:
    """Rank ``rank``'s CURVE key pair (public, secret; Z85), the same on every rank that holds the
    job's secret."""
    import zmq
    from zmq.utils import z85
    raw = secret.digest(b"clairvoyant curve key of rank %d" % int(rank))
    private = z85.encode(raw)
    return zmq.curve_public(private), private
