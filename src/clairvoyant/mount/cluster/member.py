"""MECHANISM: a cluster mount started by a launcher, as two processes: the member the launcher runs,
and the node's mount service that the member starts (or finds) and that outlives it.

Gang launchers (``mpirun``, torchrun's agents, ``srun``) end every process of a job when one of
them fails; a mount is a per-node service that programs on the node depend on. So the process the
launcher starts (``clairvoyant mount --cluster SRC MNT``: :func:`run_member`) only forms the
cluster: it joins the launcher's rendezvous (cluster/members.py ``rendezvous``: MPI's collectives, or
torchrun's store), starts the node's mount service in a session of its own (``--serve-node``:
:func:`run_service`, the ``Mount`` with a ``ServiceLink``), or finds the one already serving
``MNT`` (a launcher that restarted its workers, a new job around running mounts), checks with the
other members that every node lists the same files, exchanges the services' ZeroMQ addresses and
gives them to its service (``join``). The peer reads go service to service over ZeroMQ
(mount/cluster/links.py), without the launcher.

How each end is taken (the member is told over the service's control socket):

- **Ctrl-C** (SIGINT to the member; torchrun passes its own on as SIGINT): the member asks its
  service to unmount, and waits for it.
- **A launcher's teardown** (SIGTERM: ``mpirun`` sends it both when it is interrupted and when a
  rank died; torchrun when a worker failed): the member asks its service to ``leave``. The service
  probes its peers: if every one answers, the whole job is ending and it unmounts (after
  ``LEAVE_GRACE``, answering the others' probes meanwhile); if one does not, a node was lost and
  the launcher ends the job because of it: the service goes on serving, from its tier, the peers
  that answer, and the store, and says so in its log.
- **The member killed** (SIGKILL, nothing said): the service goes on, as above.
- **`clairvoyant umount MNT`** (SIGTERM to the service) unmounts; the member, if any, then ends.

A node started again joins the others at the next formation of the cluster (a restarted launcher,
torchrun's ``--max-restarts``): every member gives its service the new addresses, and a service
that was serving already logs that it rejoined.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid

from ...cluster.timeouts import GATHER_TIMEOUT
from ...errors import ClairvoyantError, ConfigError
from ...nodeio.signals import SignalFlag
from ...plan import membership

SERVICE_SECRET_VAR = "CLAIRVOYANT_SERVICE_SECRET"   # the job's secret, from a member to the service it starts
SERVICE_PREFIX = "clairvoyant-service-"   # <tmp>/clairvoyant-service-<pid>.log and .ctl: a service's log and control
LEAVE_GRACE = 4.0    # seconds a leaving service keeps answering its peers' probes before it unmounts
_LAUNCHER_VARS = ("OMPI_", "PMIX_", "PRTE_", "TORCHELASTIC_", "GROUP_", "ROLE_", "LOCAL_", "MASTER_", "RANK",
                  "WORLD_SIZE", "SLURM_STEP", "PMI_")


def _paths(pid: int) -> tuple[str, str]:
    stem = os.path.join(tempfile.gettempdir(), f"{SERVICE_PREFIX}{pid}")
    return stem + ".log", stem + ".ctl"


def _sweep() -> None:
    """Remove the logs and control sockets of services that are gone (killed: nothing cleaned up)."""
    from ..fs import left_by_the_dead
    for path in left_by_the_dead(tempfile.gettempdir(), SERVICE_PREFIX):
        with contextlib.suppress(OSError):
            os.unlink(path)


def ask(control: str, msg: dict, timeout: float = 5.0) -> dict | None:
    """The service's answer to ``msg`` over its control socket, or None (no answer in time)."""
    import zmq
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.REQ)
    s.setsockopt(zmq.LINGER, 0)
    try:
        s.connect(f"ipc://{control}")
        s.send(json.dumps(msg).encode())
        if not s.poll(int(timeout * 1000)):
            return None
        got = json.loads(s.recv())
        return got if isinstance(got, dict) else None
    except (zmq.ZMQError, ValueError):
        return None
    finally:
        s.close(0)


# -- the member: what the launcher runs ----------------------------------------------------------------

class _Service:
    """The node's mount service as the member sees it: its pid, control socket and log."""

    def __init__(self, pid: int, control: str, log: str, proc: subprocess.Popen | None) -> None:
        self.pid, self.control, self.log, self.proc = pid, control, log, proc
        self._at = 0
        self._file = None   # the log, held open once read: a service that ends cleanly removes its log,
                            # and what it wrote last (why it unmounted) is still read from here

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        from ...nodeio.fileio import process_alive
        return process_alive(self.pid)

    def relay(self, out=None) -> None:
        """Print what the service logged since the last call (on the member's own output)."""
        out = out or sys.stdout
        try:
            if self._file is None:
                self._file = open(self.log, "rb")
                self._file.seek(self._at)
            text = self._file.read()
        except OSError:
            return
        self._at += len(text)
        if text:
            out.write(text.decode(errors="replace"))
            out.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _adopt(mnt: str, node: int, nodes: int, source: str, local_dir: str | None, secret) -> _Service | None:
    """The service already serving ``mnt`` for node ``node`` of ``nodes``, or None (nothing mounted
    there). A ConfigError where another mount serves it, a member of another job still has it, or
    its peers' keys come from another secret than ``secret`` (the job's)."""
    from ...fuse.daemon import mounted
    from ..fs import read_info
    if not mounted(mnt):
        return None
    try:
        info = read_info(mnt)
    except ConfigError:
        return None   # a dead mount: the service's start clears it (check_mountpoint)
    control = info.get("control")
    hello = ask(control, {"op": "hello"}) if control else None
    if hello is None:
        raise ConfigError(f"{mnt} is mounted by another clairvoyant mount (pid {info.get('pid')}, not a cluster's "
                          f"service); unmount it (clairvoyant umount {mnt}) first")
    if (hello["node"], hello["nodes"]) != (node, nodes) or info.get("source") != source:
        raise ConfigError(f"{mnt} is served as node {hello['node']} of {hello['nodes']} mounts of "
                          f"{info.get('source')}, not node {node} of {nodes} of {source}; unmount it "
                          f"(clairvoyant umount {mnt}) first")
    from ...nodeio.fileio import process_alive
    member = int(hello.get("member", -1))
    if member > 0 and member != os.getpid() and process_alive(member):
        raise ConfigError(f"{mnt} is served for a cluster whose member on this node (pid {member}) still runs: "
                          "end that job first, or mount elsewhere")
    if local_dir and os.path.realpath(local_dir) != os.path.realpath(info.get("local_dir", local_dir)):
        raise ConfigError(f"{mnt} is served with its local tier in {info.get('local_dir')}, not {local_dir}; "
                          f"unmount it (clairvoyant umount {mnt}) to start it with another")
    from ...cluster.secret import key_id
    if hello.get("secret") != key_id(secret):
        raise ConfigError(f"{mnt} is served with its peers' keys from another job secret than this launch's "
                          f"({'none: CLAIRVOYANT_PEER_AUTH=off' if secret is None else secret.where}); unmount it "
                          f"(clairvoyant umount {mnt}) and launch again, or give every launch the same secret "
                          "(CLAIRVOYANT_JOB_SECRET, or the secret file in the home directory: docs/security.md)")
    log, _ = _paths(int(hello["pid"]))
    svc = _Service(int(hello["pid"]), control, log, None)
    try:
        svc._at = os.path.getsize(log)
    except OSError:
        pass
    return svc


def _spawn(args: argparse.Namespace, src: str, mnt: str, local_dir: str | None, node: int, nodes: int,
           host: str, secret) -> _Service:
    """Start the node's mount service in a session of its own (a launcher's teardown does not reach
    it), its output in its log."""
    _sweep()
    tmp_log = os.path.join(tempfile.gettempdir(), f"{SERVICE_PREFIX}new-{uuid.uuid4().hex}.log")
    cmd = [sys.executable, "-m", "clairvoyant", "mount", src, mnt, "--serve-node", f"{node}/{nodes}",
           "--peer-host", host, "--member", str(os.getpid())]
    if local_dir:
        cmd += ["--local-dir", local_dir]
    if args.local_capacity:
        cmd += ["--local-capacity", args.local_capacity]
    if args.stage_threads is not None:
        cmd += ["--stage-threads", str(args.stage_threads)]
    if args.reindex:
        cmd += ["--reindex"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_VARS)}
    if secret is not None:   # (its environment is readable by this user and root only)
        env[SERVICE_SECRET_VAR] = secret.key.hex()
    with open(tmp_log, "wb") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, close_fds=True)
    log, control = _paths(proc.pid)
    os.rename(tmp_log, log)   # (the service writes on through its descriptor)
    return _Service(proc.pid, control, log, proc)


def _ready(svc: _Service, told: SignalFlag) -> dict | None:
    """The service's hello once it has listed its files (its fingerprint), or None: it ended, it
    was not ready within ``GATHER_TIMEOUT``, or the launcher ended the member meanwhile."""
    deadline = time.monotonic() + GATHER_TIMEOUT
    while svc.alive() and time.monotonic() < deadline and not told.is_set():
        svc.relay(sys.stderr)
        hello = ask(svc.control, {"op": "hello"}, 1.0) if os.path.exists(svc.control) else None
        if hello is not None and hello.get("fingerprint"):
            svc.relay(sys.stderr)
            return hello
        time.sleep(0.1)
    svc.relay(sys.stderr)
    return None


def _stop_spawned(svc: _Service | None) -> None:
    """End a service this member started and that serves nothing yet (the cluster did not form)."""
    if svc is not None and svc.proc is not None and svc.proc.poll() is None:
        svc.proc.terminate()


def run_member(args: argparse.Namespace, group) -> int:
    """``clairvoyant mount --cluster SRC MNT`` under a launcher: this node's member (module docstring);
    ``group``: the launcher's rendezvous (cluster/members.py)."""
    from ...cluster.group import agree
    from ...cluster.members import exchange_addresses, peer_host
    from ...cluster.secret import job_secret
    node, nodes = group.rank, group.size
    src, mnt, local_dir = args.paths[0], args.paths[1].replace("{node}", str(node)), args.local_dir
    local_dir = local_dir.replace("{node}", str(node)) if local_dir else local_dir
    src, mnt = os.path.realpath(src), os.path.realpath(mnt)
    told = SignalFlag()   # (not an Event: nodeio/signals.py)
    told.install(membership.SIGNALS)

    svc: _Service | None = None
    try:
        secret = job_secret(group)   # (collective; every rank raises alike) the services' keys (cluster/secret.py)
    except ConfigError as e:
        print(f"clairvoyant: node {node}'s mount did not start ({e})", file=sys.stderr, flush=True)
        return 1
    hello: dict | None = None
    error: BaseException | None = None
    adopted = False
    try:   # (a failure here is said to every member at the exchange below: none waits for this node)
        host = peer_host(group)      # (collective) the one address rule (cluster/members.py)
        svc = _adopt(mnt, node, nodes, src, local_dir, secret)
        adopted = svc is not None
        if svc is None:
            svc = _spawn(args, src, mnt, local_dir, node, nodes, host, secret)
        hello = _ready(svc, told)
    except ConfigError as e:
        error = e
    if told.is_set() and hello is None:   # the launcher ends the job (another node's failure)
        _stop_spawned(svc)
        print(f"clairvoyant: node {node}: ended by the launcher before the cluster formed", file=sys.stderr,
              flush=True)
        return 1
    if hello is None and error is None:
        why = f"was not ready within {GATHER_TIMEOUT:.0f} s" if svc.alive() else "ended"
        error = ConfigError(f"its mount service {why} (its log: {svc.log})")
    try:   # the one formation rule (cluster/members.py ``exchange_addresses``, as for the Loader's ranks): where a
        # node's service cannot start, every node raises, that node its own error, the others naming it
        addresses = exchange_addresses(group, None if error is not None else hello["address"], error)
        agree(group, bytes.fromhex(hello["fingerprint"]), "the mounted source's files (names and sizes)")
    except ClairvoyantError as e:   # (a PeerLost too: a node gone before the cluster formed)
        if svc is not None and hello is not None:   # (a service waiting to join: its start fails with this)
            ask(svc.control, {"op": "join", "addresses": None, "error": str(e), "member": os.getpid()})
        if not adopted:
            _stop_spawned(svc)
        print(f"clairvoyant: node {node}'s mount did not start ({e}); every node of the job stops alike, none "
              "waits for it", file=sys.stderr, flush=True)
        return 1
    ask(svc.control, {"op": "join", "addresses": addresses, "error": None, "member": os.getpid()})
    while svc.alive() and not told.is_set():   # until it is mounted
        hello = ask(svc.control, {"op": "hello"}, 1.0)
        if hello is not None and hello.get("mounted"):
            break
        svc.relay(sys.stderr)
        time.sleep(0.1)
    svc.relay(sys.stderr)
    if hello is not None and hello.get("mounted"):
        how = "rejoined the cluster, serving on" if adopted else "joined the cluster"
        print(f"clairvoyant: node {node} of {nodes}: the mount at {mnt} {how} (service pid {svc.pid}, its log "
              f"{svc.log}); Ctrl-C or `clairvoyant umount {mnt}` unmounts", flush=True)
    while svc.alive() and not told.wait(0.2):
        svc.relay(sys.stderr)
    if told.is_set():   # tell the service, and wait for what it does
        asked = membership.told(told.signals[-1])
        ask(svc.control, {"op": asked})
        end = time.monotonic() + LEAVE_GRACE + 10
        while svc.alive() and time.monotonic() < end:
            svc.relay(sys.stderr)
            hello = ask(svc.control, {"op": "hello"}, 0.5)
            if asked == membership.LEAVE and hello is not None and hello.get("serving_on"):   # (a node was lost)
                break
            time.sleep(0.1)
        svc.relay(sys.stderr)
        svc.close()
        return 0
    svc.relay(sys.stderr)
    svc.close()
    for path in (svc.log, svc.control):   # (a service killed cleans nothing up: its member does)
        with contextlib.suppress(OSError):
            os.unlink(path)
    code = svc.proc.returncode if svc.proc is not None else 0
    if code:
        print(f"clairvoyant: node {node}'s mount service ended (exit status {code})", file=sys.stderr, flush=True)
    return 1 if code else 0


# -- the service: the node's mount, in a session of its own ---------------------------------------------

def service_secret():
    """The job's secret its member handed this service (taken out of ``os.environ``, so that no
    process it starts inherits it; its initial environment in /proc stays readable by this user
    and root, as docs/security.md says), or None where authentication is off."""
    from ...cluster.secret import MIN_LENGTH, JobSecret, auth_off
    raw = os.environ.pop(SERVICE_SECRET_VAR, "")
    if auth_off():
        return None
    try:
        key = bytes.fromhex(raw)
    except ValueError:
        key = b""
    if len(key) < MIN_LENGTH:
        raise ConfigError(f"a cluster's mount service starts with the job's secret from its member ({SERVICE_SECRET_VAR}): "
                          "start it with `clairvoyant mount --cluster` under a launcher, not by hand")
    return JobSecret(key, "the member that started this service")


def run_service(args: argparse.Namespace) -> int:
    """``clairvoyant mount SRC MNT --serve-node N/NODES ...`` (started by a member): the node's mount
    with a ServiceLink until unmounted (module docstring)."""
    from ...cluster.members import Members
    from ...cluster.secret import key_id
    from ...cluster.wire_zmq import ZmqWire
    from .links import ServiceLink
    from ..fs import Mount
    node, nodes = (int(x) for x in args.serve_node.split("/"))
    stop = SignalFlag()   # (not an Event: nodeio/signals.py)
    stop.install(membership.SIGNALS)
    log_path, control = _paths(os.getpid())
    try:
        secret = service_secret()
        members = Members(node, nodes, ZmqWire(node, nodes, args.peer_host, secret=secret))   # (joined by its member)
        link = ServiceLink(members, secret_id=key_id(secret), control=control, member_pid=int(args.member))
    except ConfigError as e:
        print(f"clairvoyant: node {node}'s mount did not start: {e}", flush=True)
        return 1
    try:
        m = Mount(args.paths[0], args.paths[1], local_dir=args.local_dir, local_capacity=args.local_capacity,
                  reindex=args.reindex, cluster=link,
                  **({} if args.stage_threads is None else {"stage_threads": args.stage_threads}))
    except BaseException as e:
        print(f"clairvoyant: node {node}'s mount did not start: {type(e).__name__}: {e}", flush=True)
        link.close()
        return 1
    clean = False
    try:
        link.described = {"mount": m.path, "tier": m.tiers.local.root}
        print(f"clairvoyant: {m.source.root} mounted read-only at {m.path} (local tier {m.tiers.local.root}, up to "
              f"{m.capacity}); node {node} of a cluster of {nodes} mounts", flush=True)
        told_gone = -1   # the member whose end was logged
        while not stop.is_set():
            link.asked_event.wait(0.2)
            link.asked_event.clear()
            if not m.alive():
                code = m.proc.poll()
                print(f"clairvoyant: the mount daemon of {m.path} is gone (exit status {code}"
                      f"{': unmounted from outside' if code == 0 else ''}); cleaning up", flush=True)
                clean = code == 0
                return 0 if clean else 1
            if link.asked == membership.UNMOUNT:
                print(f"clairvoyant: node {node}: interrupted at the launcher (Ctrl-C); unmounting", flush=True)
                break
            joins = link.leave_asked()
            if joins is not None:
                since = time.monotonic()
                found = link.probe()   # (a draining node answers: the job's end does not wait on it)
                leaving = membership.on_leave(found.silent, found.orphaned)
                if leaving.unmount:
                    stop.wait(max(0.0, LEAVE_GRACE - (time.monotonic() - since)))   # (the others' probes answered)
                    if link.still_leaving(joins):
                        print(f"clairvoyant: node {node}: the launcher ends this mount's member and {leaving.why}; "
                              "unmounting", flush=True)
                        break
                    continue   # (formed again meanwhile)
                if link.serve_on(joins, found.lost):
                    told_gone = link.member
                    print(f"clairvoyant: node {node}: the launcher ends this mount's member and {leaving.why}; serving on "
                          f"at {m.path} from this node's tier, the nodes that answer and the store (a launcher "
                          f"started again forms the cluster again; `clairvoyant umount {m.path}` unmounts)", flush=True)
                continue
            if told_gone != link.member and not link.member_alive():
                told_gone = link.member
                print(f"clairvoyant: node {node}: the launcher's process of this mount is gone; serving on at {m.path} "
                      "(from the tier, the nodes that answer and the store) until a launcher forms the cluster "
                      f"again or `clairvoyant umount {m.path}`", flush=True)
        clean = True
        return 0
    finally:
        m.close()
        link.close()
        if clean:
            with contextlib.suppress(OSError):
                os.unlink(log_path)
