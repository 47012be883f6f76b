"""The FUSE daemons are built with the package, never at run time (issue 30): a wheel carries both
executables, links nothing but glibc (libfuse3 is loaded by the daemon, xxhash compiled in), is a
manylinux wheel, and mounts on a node with no compiler and no headers."""

from __future__ import annotations

import glob
import os
import re
import shutil
import struct
import subprocess
import sys
import textwrap
import time

import pytest

from clairvoyant.fuse import daemon as fusebase
from clairvoyant.errors import SourceError
from clairvoyant.fuse.daemon import Daemon
from clairvoyant.mount import fs as mount_fs
from clairvoyant.testing import fusestore

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the project's checkout
DAEMONS = {"mountfs": mount_fs.DAEMON, "emufs": fusestore._DAEMON}
FORBIDDEN = ("libfuse", "libxxhash")


def needed(path: str) -> list[str]:
    """The DT_NEEDED entries of an ELF64 little-endian file: the libraries it links directly."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, f"{path}: not an ELF64 little-endian file"
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    # sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, sh_info, sh_addralign, sh_entsize
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    libs = []
    for sec in sections:
        if sec[1] != 6:   # SHT_DYNAMIC
            continue
        strtab = sections[sec[6]][4]
        for at in range(sec[4], sec[4] + sec[5], 16):
            tag, val = struct.unpack_from("<qQ", data, at)
            if tag == 0:      # DT_NULL
                break
            if tag == 1:      # DT_NEEDED
                libs.append(data[strtab + val:data.index(b"\0", strtab + val)].decode())
    return libs


def linked_forbidden(path: str) -> list[str]:
    """What ``path`` links of libfuse3 or libxxhash: its NEEDED entries and, where ldd runs, all it loads."""
    found = [lib for lib in needed(path) if lib.startswith(FORBIDDEN)]
    if shutil.which("ldd"):
        out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
        found += [line.split()[0] for line in out.splitlines() if line.strip().startswith(FORBIDDEN)]
    return found


def link_with_libfuse3(out: str) -> None:
    """A tiny program linked with -lfuse3 (a negative control); skips without cc or libfuse3's .so."""
    if not shutil.which("cc"):
        pytest.skip("no C compiler to build the negative control linked with libfuse3")
    src = out + ".c"
    with open(src, "w") as f:
        f.write("int fuse_version(void);\nint main(void) { return fuse_version() < 0; }\n")
    r = subprocess.run(["cc", "-o", out, src, "-lfuse3"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot link with -lfuse3 (libfuse3-dev missing?): {r.stderr.strip()}")


# -- the installed daemons (this environment's install: editable here) -------------------------------


def fuse_headers_here() -> bool:
    return any(os.path.exists(os.path.join(d, "fuse3", "fuse.h")) for d in ("/usr/include", "/usr/local/include"))


@pytest.fixture
def installed():
    """The daemons of this install; skips where it was built without libfuse3's headers (they are optional)."""
    if not fuse_headers_here() and not all(os.access(d.binary_path(), os.X_OK) for d in DAEMONS.values()):
        pytest.skip("libfuse3's headers are not here, so this install has no FUSE daemons "
                    "(scripts/install-sysdeps.sh, then pip install -e . again)")
    return DAEMONS


@pytest.mark.parametrize("name", sorted(DAEMONS))
def test_the_daemon_is_installed_in_its_package(installed, name):
    daemon = installed[name]
    assert daemon.binary() == daemon.binary_path() and os.access(daemon.binary_path(), os.X_OK), daemon.missing()
    assert os.path.dirname(daemon.binary_path()) == os.path.dirname(
        {"mountfs": mount_fs.__file__, "emufs": fusestore.__file__}[name])


@pytest.mark.parametrize("name", sorted(DAEMONS))
def test_the_daemon_links_neither_libfuse3_nor_libxxhash(installed, name):
    path = installed[name].binary()
    libs = needed(path)
    assert "libc.so.6" in libs, libs   # the reader reads NEEDED entries at all
    assert linked_forbidden(path) == [], libs


def test_the_link_check_sees_a_program_linked_with_libfuse3(tmp_path):
    prog = str(tmp_path / "linked")
    link_with_libfuse3(prog)
    assert "libfuse3.so.3" in needed(prog)
    assert linked_forbidden(prog)


def test_a_missing_libfuse3_is_named_with_what_to_install(installed, monkeypatch, tmp_path):
    if not (os.path.exists("/dev/fuse") and shutil.which("fusermount3")):
        pytest.skip("no /dev/fuse or fusermount3: the check stops before loading libfuse3")
    monkeypatch.setenv("CLAIRVOYANT_LIBFUSE", str(tmp_path / "nowhere" / "libfuse3.so.3"))
    for name, daemon in DAEMONS.items():
        ok, why = daemon.available()
        assert not ok and why.startswith(f"{name}: cannot load FUSE 3's library"), why
        assert "CLAIRVOYANT_LIBFUSE" in why and "apt-get install fuse3" in why, why
        r = subprocess.run([daemon.binary(), "--check-libfuse"], capture_output=True, text=True)
        assert r.returncode == 78 and r.stderr.strip() == why
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a").write_bytes(b"x")
    (tmp_path / "mnt").mkdir()
    with pytest.raises(SourceError, match="cannot load FUSE 3's library"):
        mount_fs.Mount(tmp_path / "src", tmp_path / "mnt", local_dir=tmp_path / "local")
    with pytest.raises(SourceError, match="cannot load FUSE 3's library"):
        fusestore.FuseStore(tmp_path / "src")
    # control: the library found, the same check passes
    monkeypatch.delenv("CLAIRVOYANT_LIBFUSE")
    assert all(d.available() == (True, "") for d in DAEMONS.values())


def test_a_missing_daemon_says_how_to_get_it(tmp_path):
    daemon = Daemon("mountfs", str(tmp_path))
    if not (os.path.exists("/dev/fuse") and shutil.which("fusermount3")):
        pytest.skip("no /dev/fuse or fusermount3: the check stops before looking for the daemon")
    ok, why = daemon.available()
    assert not ok and f"no executable {tmp_path / 'mountfs'}" in why, why
    assert "scripts/install-sysdeps.sh" in why, why
    if os.path.abspath(fusebase.__file__).startswith(os.path.join(ROOT, "src") + os.sep):   # an editable install
        assert f"pip install -e {ROOT}" in why, why
    else:
        assert "reinstall it from a wheel" in why, why
    with pytest.raises(SourceError, match="mountfs FUSE daemon is not installed"):
        daemon.binary()


# -- the wheel ----------------------------------------------------------------------------------------


def clean_copy(dest) -> None:
    """What a build of the working tree reads, copied to ``dest`` (no build/, no editable outputs)."""
    dest.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md", *map(os.path.basename, glob.glob(f"{ROOT}/LICEN[CS]E*"))):
        shutil.copy2(os.path.join(ROOT, name), dest / name)
    shutil.copytree(os.path.join(ROOT, "src"), dest / "src", ignore=shutil.ignore_patterns(
        "*.so", "__pycache__", "*.egg-info", "mountfs", "emufs"))


def build_wheel(top, prefix: list[str] = ()) -> tuple[str, str]:
    """(the wheel of a clean copy of the working tree, pip's verbose output), built under ``prefix``.
    The build backend is the dev environment's setuptools (>= 77, as pyproject asks)."""
    clean_copy(top / "clairvoyant")
    r = subprocess.run([*prefix, sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
                        "--disable-pip-version-check", "-w", str(top / "dist"), str(top / "clairvoyant")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    wheels = glob.glob(str(top / "dist" / "clairvoyant-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0], r.stdout + r.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
    if not (fuse_headers_here() and shutil.which("cc")):
        pytest.skip("building the wheel's FUSE daemons needs a C compiler and libfuse3's headers "
                    "(scripts/install-sysdeps.sh)")
    return build_wheel(tmp_path_factory.mktemp("wheel"))[0]


def auditwheel_tag(whl: str) -> str:
    r = subprocess.run([sys.executable, "-m", "auditwheel", "show", whl], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r'consistent with the\s+following platform tag:\s+"([^"]+)"', r.stdout)
    assert m, r.stdout
    return m.group(1)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_wheel_is_manylinux(wheel, tmp_path):
    import zipfile

    try:
        import auditwheel  # noqa: F401
    except ImportError:
        pytest.skip("auditwheel is not installed (it is in the test extra: pip install -e '.[test]')")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for member in ("clairvoyant/mount/mountfs", "clairvoyant/testing/emufs"):
            assert member in names, sorted(n for n in names if not n.endswith(".py"))
            assert z.getinfo(member).external_attr >> 16 & 0o111, f"{member} is not executable in the wheel"
    tag = auditwheel_tag(wheel)
    assert re.fullmatch(r"manylinux_2_\d+_x86_64", tag), tag
    # negative control: the same wheel with a daemon linked with libfuse3 is not manylinux
    prog = str(tmp_path / "linked")
    link_with_libfuse3(prog)
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    bad = str(bad_dir / os.path.basename(wheel))
    with open(prog, "rb") as f:
        linked = f.read()
    with zipfile.ZipFile(wheel) as z, zipfile.ZipFile(bad, "w", zipfile.ZIP_DEFLATED) as out:
        for info in z.infolist():
            out.writestr(info, linked if info.filename == "clairvoyant/mount/mountfs" else z.read(info))
    assert auditwheel_tag(bad) == "linux_x86_64"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_build_machine_without_libfuse3_headers_installs_without_the_daemons(tmp_path):
    """Optional, as the extensions: the wheel builds, with the extensions, and says what is missing."""
    import zipfile

    if os.geteuid() != 0 or not shutil.which("unshare") or \
            subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("hiding libfuse3's headers needs root and unshare -m")
    hidden = [d for d in ("/usr/include/fuse3", "/usr/local/include/fuse3") if os.path.isdir(d)]
    if not hidden:
        pytest.skip("no libfuse3 headers here to hide")
    hide = " && ".join(f"mount -t tmpfs tmpfs {d}" for d in hidden)
    whl, out = build_wheel(tmp_path, ["unshare", "-m", "--propagation", "private", "sh", "-c", f'{hide} && exec "$@"',
                                      "sh"])
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
    assert not {"clairvoyant/mount/mountfs", "clairvoyant/testing/emufs"} & names
    assert sum(n.endswith(".so") for n in names) == 3, sorted(n for n in names if not n.endswith(".py"))
    for name in ("mountfs", "emufs"):
        assert f"the {name} FUSE daemon is not built (libfuse3's header fuse.h is not found" in out, out[-3000:]
    assert "libfuse3-dev" in out and "scripts/install-sysdeps.sh" in out


NO_COMPILER_NODE = r"""
set -eu
# a compute node: no headers, every compiler fails (this mount namespace only)
mount -t tmpfs -o size=1m,mode=0755 tmpfs /usr/include
for c in $COMPILERS; do mount --bind "$FAIL" "$c"; done
if cc --version >/dev/null 2>&1 || gcc --version >/dev/null 2>&1; then echo "a compiler still works"; exit 10; fi
[ -z "$(ls -A /usr/include)" ] || { echo "/usr/include is not empty"; exit 11; }
echo "node: no compiler, no headers"
echo "cached before: $(ls -A "$XDG_CACHE_HOME")"

mnt_pid=
trap 'set +e; [ -z "$mnt_pid" ] || kill $mnt_pid 2>/dev/null; ! grep -q " $MNT " /proc/mounts || fusermount3 -u -z "$MNT"' EXIT
mount_up() {   # clairvoyant mount SRC MNT in the background, until MNT is in /proc/mounts
    "$VENV/bin/clairvoyant" mount "$SRC" "$MNT" --local-dir "$LOCAL" >"$1" 2>&1 &
    mnt_pid=$!
    i=0
    until grep -q " $MNT fuse" /proc/mounts; do
        kill -0 $mnt_pid 2>/dev/null || { echo "clairvoyant mount exited:"; cat "$1"; exit 12; }
        i=$((i + 1)); [ $i -lt 600 ] || { echo "no mount after 60 s:"; cat "$1"; exit 13; }
        sleep 0.1
    done
}
mount_down() {
    "$VENV/bin/clairvoyant" umount "$MNT"
    wait $mnt_pid || { echo "clairvoyant mount failed:"; cat "$1"; exit 14; }
    mnt_pid=
    if grep -q " $MNT " /proc/mounts; then echo "still mounted"; exit 17; fi
}

mount_up "$WORK/mount1.log"
echo "listing: $(cd "$MNT" && find . -type f | sort | tr '\n' ' ')"
cmp "$SRC/a/one.bin" "$MNT/a/one.bin"
diff -r "$SRC" "$MNT"
mount_down "$WORK/mount1.log"
echo "mounted, read, unmounted"

"$VENV/bin/python" -c 'import clairvoyant, clairvoyant.nodeio._fastio, clairvoyant.cache._stager, clairvoyant.plan._belady
print("imported from", clairvoyant.__file__)'

# without the daemon: the mount says how to get it, and that advice (a wheel) works here
rm "$PKG/mount/mountfs"
if "$VENV/bin/clairvoyant" mount "$SRC" "$MNT" >"$WORK/missing.log" 2>&1; then echo "mounted without mountfs"; exit 15; fi
cat "$WORK/missing.log"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps --no-index "$WHEEL"
mount_up "$WORK/mount2.log"
cmp "$SRC/b/two.bin" "$MNT/b/two.bin"
mount_down "$WORK/mount2.log"
echo "reinstalled from the wheel, mounted again"

# without libfuse3's shared library: the daemon names it and what to install
for lib in $LIBFUSE; do mount --bind "$EMPTY" "$lib"; done
if "$VENV/bin/clairvoyant" mount "$SRC" "$MNT" >"$WORK/nolib.log" 2>&1; then echo "mounted without libfuse3"; exit 16; fi
cat "$WORK/nolib.log"
echo "executables cached: $(find "$XDG_CACHE_HOME" -type f -perm -u+x | tr '\n' ' ')"
"""


def libfuse3_files() -> list[str]:
    """The files dlopen("libfuse3.so.3") may load here (by ld.so's cache, and the usual folders)."""
    paths = glob.glob("/usr/lib/libfuse3.so.3*") + glob.glob("/usr/lib/*/libfuse3.so.3*")
    paths += glob.glob("/usr/lib64/libfuse3.so.3*") + glob.glob("/lib/*/libfuse3.so.3*")
    if shutil.which("ldconfig"):
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
        paths += [line.split(" => ")[-1].strip() for line in out.splitlines() if "libfuse3.so.3" in line]
    return sorted({os.path.realpath(p) for p in paths if os.path.exists(p)})


def compilers() -> list[str]:
    """Every C compiler on this machine, as the files the names resolve to."""
    names = ["cc", "c89", "c99", "gcc", "clang", "tcc", "x86_64-linux-gnu-gcc", "/usr/bin/cc", "/usr/bin/gcc"]
    names += glob.glob("/usr/bin/gcc-[0-9]*") + glob.glob("/usr/bin/x86_64-linux-gnu-gcc-[0-9]*")
    names += glob.glob("/usr/bin/clang-[0-9]*")
    found = {os.path.realpath(p) for p in (shutil.which(n) for n in names) if p}
    return sorted(found)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_wheel_mounts_on_a_node_without_compiler_or_headers(wheel, tmp_path):
    for what in ("/dev/fuse",):
        if not os.path.exists(what):
            pytest.skip(f"no {what}")
    for tool in ("unshare", "fusermount3", "mount"):
        if not shutil.which(tool):
            pytest.skip(f"no {tool} on PATH")
    if os.geteuid() != 0:
        pytest.skip("unshare -m and bind mounts over the compilers need root")
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare -m is not permitted here (a container without CAP_SYS_ADMIN?)")
    started = time.monotonic()
    # a fresh environment with the wheel alone (its dependencies from the package index or pip's cache)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLAIRVOYANT_", "PYTHON", "VIRTUAL_ENV"))}
    r = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        wheel], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    pkg = subprocess.run([str(venv / "bin" / "python"), "-c", "import clairvoyant, os; "
                          "print(os.path.dirname(clairvoyant.__file__))"], capture_output=True, text=True,
                         env=env, check=True).stdout.strip()
    assert pkg.startswith(str(venv)), pkg   # the fresh environment's copy, not the checkout's
    installed = time.monotonic()

    src, mnt, work = tmp_path / "data", tmp_path / "mnt", tmp_path / "work"
    for d in (src / "a", src / "b", mnt, work, tmp_path / "xdg", tmp_path / "tmp"):
        d.mkdir(parents=True)
    (src / "a" / "one.bin").write_bytes(os.urandom(100_000))
    (src / "b" / "two.bin").write_bytes(os.urandom(5_000))
    (src / "top.txt").write_text("hello\n")
    fail = work / "no-compiler"
    fail.write_text("#!/bin/sh\necho 'no compiler on this node' >&2\nexit 1\n")
    fail.chmod(0o755)
    empty = work / "empty"
    empty.write_bytes(b"")
    libfuse = libfuse3_files()
    script = work / "node.sh"
    script.write_text(textwrap.dedent(NO_COMPILER_NODE))
    node_env = {**env, "PATH": f"{venv}/bin:{env.get('PATH', '/usr/bin:/bin')}", "VENV": str(venv), "PKG": pkg,
                "WHEEL": wheel, "SRC": str(src), "MNT": str(mnt), "LOCAL": str(tmp_path / "local"),
                "WORK": str(work), "FAIL": str(fail), "EMPTY": str(empty), "COMPILERS": " ".join(compilers()),
                "LIBFUSE": " ".join(libfuse), "XDG_CACHE_HOME": str(tmp_path / "xdg"), "TMPDIR": str(tmp_path / "tmp")}
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", str(script)], capture_output=True,
                       text=True, env=node_env, timeout=300)
    out = r.stdout + r.stderr
    print(out)
    print(f"wheel installed in {installed - started:.1f} s, node checks {time.monotonic() - installed:.1f} s")
    assert r.returncode == 0, out
    assert "node: no compiler, no headers" in out and "cached before: \n" in out
    assert "executables cached: \n" in out   # nothing was built at run time
    assert "mounted, read, unmounted" in out and f"imported from {pkg}/__init__.py" in out
    # the missing daemon's advice, followed: a wheel
    assert "mountfs FUSE daemon is not installed" in out and "reinstall it from a wheel" in out, out
    assert "reinstalled from the wheel, mounted again" in out
    # the missing library: named, with what to install
    assert "mountfs: cannot load FUSE 3's library libfuse3.so.3" in out and "apt-get install fuse3" in out, out
    assert not mount_fs.mounted(str(mnt))
