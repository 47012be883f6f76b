"""A cluster mount's member and the service it starts or finds hold the job's keys alike
(mount/cluster/member.py, cluster/secret.py). Each check has a control."""

from __future__ import annotations

import os

import pytest

from clairvoyant.cluster.secret import JobSecret, key_id
from clairvoyant.errors import ConfigError
from clairvoyant.mount.cluster import member as member


def _found(monkeypatch, tmp_path, hello: dict) -> None:
    """A service that serves ``tmp_path`` as node 0 of 2 and answers ``hello``."""
    monkeypatch.setattr("clairvoyant.fuse.daemon.mounted", lambda mnt: True)
    monkeypatch.setattr("clairvoyant.mount.fs.read_info", lambda mnt: {"control": "ctl", "source": "/src", "pid": 1})
    monkeypatch.setattr(member, "ask", lambda control, msg, timeout=5.0: dict(hello))


def test_a_service_holding_another_job_s_keys_is_refused_with_advice(monkeypatch, tmp_path):
    """A running service whose keys come from another secret (or none) than this launch's: a
    ConfigError that names `clairvoyant umount` and the secret's settings, and no key material.
    Control: the same service with this launch's key id is taken over."""
    mine, theirs = JobSecret(b"m" * 32, "here"), JobSecret(b"t" * 32, "there")
    base = {"node": 0, "nodes": 2, "pid": os.getpid(), "member": -1}
    _found(monkeypatch, tmp_path, dict(base, secret=key_id(theirs)))
    with pytest.raises(ConfigError) as e:
        member._adopt(str(tmp_path), 0, 2, "/src", None, mine)
    assert "clairvoyant umount" in str(e.value) and "CLAIRVOYANT_JOB_SECRET" in str(e.value)
    assert "m" * 8 not in str(e.value) and "t" * 8 not in str(e.value)
    _found(monkeypatch, tmp_path, dict(base))   # a service from before the keys: refused too
    with pytest.raises(ConfigError, match="another job secret"):
        member._adopt(str(tmp_path), 0, 2, "/src", None, mine)
    _found(monkeypatch, tmp_path, dict(base, secret=key_id(mine)))   # control
    svc = member._adopt(str(tmp_path), 0, 2, "/src", None, mine)
    assert svc is not None and svc.pid == os.getpid()


def test_a_service_takes_its_member_s_secret_out_of_its_environment(monkeypatch):
    """The service reads the secret its member handed it and removes it from its environment (its
    own children do not inherit it); started by hand without one it refuses to start. Control:
    with authentication off it starts without one."""
    monkeypatch.delenv("CLAIRVOYANT_PEER_AUTH", raising=False)
    monkeypatch.setenv(member.SERVICE_SECRET_VAR, (b"s" * 32).hex())
    got = member.service_secret()
    assert got.key == b"s" * 32 and member.SERVICE_SECRET_VAR not in os.environ
    with pytest.raises(ConfigError, match="under a launcher"):
        member.service_secret()
    monkeypatch.setenv("CLAIRVOYANT_PEER_AUTH", "off")   # control
    assert member.service_secret() is None
