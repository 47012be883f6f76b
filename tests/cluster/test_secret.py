"""Where the job's secret comes from and how the ranks agree on it (cluster/secret.py). Each check
has a control."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from clairvoyant.cluster import secret as sec
from clairvoyant.cluster.secret import JobSecret, job_secret, key_id, rank_keys
from clairvoyant.errors import ConfigError
from thread_group import ThreadGroup


def _run(envs: list[dict]) -> list:
    """job_secret on len(envs) ranks, each with its environment: each rank's result or exception."""
    return ThreadGroup(len(envs)).run(lambda g: job_secret(g, envs[g.rank]))


def test_the_environment_s_secret_is_every_rank_s_and_a_differing_one_stops_every_rank(tmp_path):
    """CLAIRVOYANT_JOB_SECRET set alike: every rank holds it. Set on one rank only, or differently:
    a ConfigError on every rank (none waits for ever). Control: unset on all, the home file's."""
    home = {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    same = dict(home, CLAIRVOYANT_JOB_SECRET="s" * 20)
    got = _run([same, same, same])
    assert all(isinstance(x, JobSecret) and x.key == b"s" * 20 for x in got), got
    bad = _run([same, home, dict(home, CLAIRVOYANT_JOB_SECRET="t" * 20)])
    assert all(isinstance(x, ConfigError) and "not the same on every rank" in str(x) for x in bad), bad
    assert "s" * 20 not in str(bad[0]) and "t" * 20 not in str(bad[0])   # no key material in an error
    plain = _run([home, home])   # control
    assert plain[0].key == plain[1].key and "secret file" in plain[0].where


def test_a_short_secret_or_an_unreadable_file_is_refused_with_advice_that_works(tmp_path):
    with pytest.raises(ConfigError, match="at least 16"):
        sec.from_environment({"CLAIRVOYANT_JOB_SECRET": "short"})
    with pytest.raises(ConfigError, match="cannot read it"):
        sec.from_environment({"CLAIRVOYANT_JOB_SECRET_FILE": str(tmp_path / "none")})
    f = tmp_path / "s"
    f.write_bytes(b"x" * 40 + b"\xff\x00\n")   # the advice followed: a readable file holding it
    f.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):   # others may read it
        sec.from_environment({"CLAIRVOYANT_JOB_SECRET_FILE": str(f)})
    f.chmod(0o600)
    got = sec.from_environment({"CLAIRVOYANT_JOB_SECRET_FILE": str(f)})
    assert got.key == b"x" * 40 + b"\xff\x00" and str(f) in got.where   # its bytes as they are


def test_the_home_secret_file_is_made_once_0600_and_one_others_may_read_is_refused(tmp_path):
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    first = sec.from_home(env)
    path = sec.home_file(env)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and len(first.key) >= 32
    assert sec.from_home(env).key == first.key               # read again, not drawn again
    assert [p for p in os.listdir(os.path.dirname(path))] == ["job-secret"]   # no temporary left
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        sec.from_home(env)
    os.chmod(path, 0o600)                                    # the advice followed
    assert sec.from_home(env).key == first.key


def test_homes_that_differ_fall_back_to_a_secret_handed_over_and_off_must_be_alike(tmp_path):
    """Ranks whose home files differ (homes not shared) get rank 0's drawn secret through the
    group. CLAIRVOYANT_PEER_AUTH=off on every rank: no secret (None); on some only: a ConfigError
    on every rank. Control: the same home on every rank gives its file's secret."""
    a, b = {"XDG_CONFIG_HOME": str(tmp_path / "a")}, {"XDG_CONFIG_HOME": str(tmp_path / "b")}
    got = _run([a, b, a])
    assert all(isinstance(x, JobSecret) for x in got) and len({x.key for x in got}) == 1, got
    assert "drawn by rank 0" in got[0].where and len(got[0].key) == 32
    assert got[0].key != sec.from_home(a).key
    off = dict(a, CLAIRVOYANT_PEER_AUTH="off")
    assert _run([off, off]) == [None, None]
    mixed = _run([off, a])
    assert all(isinstance(x, ConfigError) for x in mixed), mixed
    same = _run([a, a])   # control
    assert same[0].key == sec.from_home(a).key


def test_keys_come_from_the_secret_and_say_nothing_of_it():
    """Every rank derives every rank's key pair alike; another secret, other keys; the secret's
    bytes appear in no repr and no key id. Control: a public key is the one its secret key gives."""
    import zmq
    s, t = JobSecret(b"k" * 32, "here"), JobSecret(b"j" * 32, "there")
    assert rank_keys(s, 3) == rank_keys(JobSecret(b"k" * 32, "elsewhere"), 3)
    assert rank_keys(s, 3) != rank_keys(s, 4) and rank_keys(s, 3) != rank_keys(t, 3)
    pub, priv = rank_keys(s, 1)
    assert zmq.curve_public(priv) == pub
    assert "k" * 8 not in repr(s) and key_id(s) != key_id(t) and key_id(None) == "off"
    with pytest.raises(ConfigError, match="'on'"):
        sec.auth_off({"CLAIRVOYANT_PEER_AUTH": "maybe"})


def test_one_rank_s_bad_secret_stops_every_rank_with_its_reason(tmp_path):
    """A secret too short on one rank: that rank's ConfigError says why, the others' name it; none
    waits. Control: the same secret long enough on both."""
    home = {"XDG_CONFIG_HOME": str(tmp_path)}
    got = _run([dict(home, CLAIRVOYANT_JOB_SECRET="short"), home])
    assert isinstance(got[0], ConfigError) and "at least 16" in str(got[0]), got
    assert isinstance(got[1], ConfigError) and "rank(s) [0]" in str(got[1]), got
    ok = _run([dict(home, CLAIRVOYANT_JOB_SECRET="x" * 16)] * 2)
    assert all(isinstance(x, JobSecret) for x in ok)


def test_a_wire_that_cannot_bind_leaves_no_thread_behind():
    """ZmqWire on an address it cannot bind: the error, and neither the authenticator's thread nor
    the context left running. Control: on loopback it binds, and its close leaves none either."""
    pytest.importorskip("zmq")
    from clairvoyant.cluster.wire_zmq import ZmqWire
    before = threading.active_count()
    with pytest.raises(Exception):
        ZmqWire(0, 2, "192.0.2.1", secret=JobSecret(b"k" * 32, "test"))   # (TEST-NET-1: not this host's)
    assert threading.active_count() == before
    w = ZmqWire(0, 2, "127.0.0.1", secret=JobSecret(b"k" * 32, "test"))   # control
    assert threading.active_count() > before
    w.shut_down(0.0, set())
    assert threading.active_count() == before
