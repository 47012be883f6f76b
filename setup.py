"""Build of the C parts; everything else is in pyproject.toml.

The extensions (_fastio, cache/_stager, plan/_belady) are optional: where they cannot be compiled,
clairvoyant falls back to the same operations in Python (slower, identical in effect; the tests
check that).

The two FUSE daemons, ``mount/mountfs`` (``clairvoyant mount``) and ``testing/emufs`` (the
emulated slow store, ``FuseStore``), are executables built here with the extensions and placed
beside them: in the wheel, and for an editable install in the source tree. Nothing is compiled at
run time (clairvoyant.fuse.daemon only finds them). Building needs a C compiler, pkg-config and the
headers of libfuse3 and xxhash (scripts/install-sysdeps.sh); running needs only glibc, /dev/fuse,
fusermount3 and FUSE 3's shared library: xxhash is compiled in from its header, and libfuse3 is
loaded by the daemon at run time (fuse/fuse_loader.h), so no wheel carries or links it. Optional too:
a build machine without those headers installs clairvoyant without the daemons, and the mount
then says what is missing.
"""

import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ext = [] if sys.platform != "linux" else [
    Extension("clairvoyant.nodeio._fastio", ["src/clairvoyant/nodeio/_fastio.c"], optional=True,
              extra_compile_args=["-O2"]),
    # staging threads in C (libxxhash-dev's header, inlined: nothing to link)
    Extension("clairvoyant.cache._stager", ["src/clairvoyant/cache/_stager.c"], optional=True,
              depends=["src/clairvoyant/cache/tier_format.h"], extra_compile_args=["-O2"]),
    Extension("clairvoyant.plan._belady", ["src/clairvoyant/plan/_belady.c"], optional=True,
              extra_compile_args=["-O2"]),
]

# package -> (executable, its C source); both include these headers of src/clairvoyant
DAEMONS = {"clairvoyant.mount": ("mountfs", "src/clairvoyant/mount/mountfs.c"),
           "clairvoyant.testing": ("emufs", "src/clairvoyant/testing/emufs.c")}
DAEMON_HEADERS = ["src/clairvoyant/fuse/fuse_common.h", "src/clairvoyant/fuse/fuse_loader.h",
                  "src/clairvoyant/mount/mount_stats.h",
                  "src/clairvoyant/cache/tier_format.h"]
BUILD_DEPS = ("a C compiler, pkg-config, libfuse3-dev and libxxhash-dev (Debian names; "
              "sh scripts/install-sysdeps.sh installs them)")


def _include_dirs(package: str, header: str, what: str) -> list[str]:
    """The -I directories of pkg-config ``package`` when it knows it, else []; an OSError naming
    what is missing when ``header`` is not found in them nor in the compiler's default places."""
    dirs: list[str] = []
    if shutil.which("pkg-config"):
        r = subprocess.run(["pkg-config", "--cflags-only-I", package], capture_output=True, text=True)
        if r.returncode == 0:
            dirs = [flag[2:] for flag in r.stdout.split() if flag.startswith("-I")]
    if not any(os.path.exists(os.path.join(d, header)) for d in [*dirs, "/usr/local/include", "/usr/include"]):
        raise OSError(f"{what}'s header {header} is not found by pkg-config {package} nor in /usr/local/include "
                      "or /usr/include")
    return dirs


class build_ext_and_daemons(build_ext):
    """build_ext, then the FUSE daemons: linked as executables into build_lib's packages (the
    wheel's), and copied into the source tree's packages where the extensions go there too
    (``inplace``: an editable install, or ``build_ext --inplace``)."""

    def run(self) -> None:
        super().run()
        if sys.platform != "linux":
            return
        for package, (name, source) in DAEMONS.items():
            try:
                self.build_daemon(package, name, source)
            except Exception as e:  # optional, as the extensions: the mount then says what is missing
                for stale in self._daemon_paths(package, name)[:2 if self.inplace else 1]:   # of an earlier build
                    if os.path.exists(stale):
                        os.unlink(stale)
                self.warn(f"the {name} FUSE daemon is not built ({e}); clairvoyant installs without it, and "
                          f"`clairvoyant mount` / FuseStore will say so. To build it, install {BUILD_DEPS}, "
                          "then install clairvoyant again")

    def _daemon_paths(self, package: str, name: str) -> tuple[str, str]:
        """(where it is built, where it goes in the source tree)."""
        regular = os.path.join(self.build_lib, *package.split("."), name)
        inplace = os.path.join(self.get_finalized_command("build_py").get_package_dir(package), name)
        return regular, inplace

    def build_daemon(self, package: str, name: str, source: str) -> None:
        from distutils.ccompiler import new_compiler
        from distutils.sysconfig import customize_compiler

        compiler = self.compiler
        if compiler is None or isinstance(compiler, str):   # no extensions were built
            compiler = new_compiler(compiler=compiler, dry_run=self.dry_run, force=self.force)
            customize_compiler(compiler)
        include = ["src/clairvoyant", "src/clairvoyant/fuse", *_include_dirs("fuse3", "fuse.h", "libfuse3"),
                   *_include_dirs("libxxhash", "xxhash.h", "xxhash")]
        regular, inplace = self._daemon_paths(package, name)
        objects = compiler.compile([source], output_dir=os.path.join(self.build_temp, "daemons"),
                                   include_dirs=include, extra_postargs=["-O2", "-Wall"],
                                   depends=DAEMON_HEADERS)
        os.makedirs(os.path.dirname(regular), exist_ok=True)
        # -ldl: dlopen is in libdl before glibc 2.34 (an empty archive after); no -lfuse3, no -lxxhash
        compiler.link_executable(objects, name, output_dir=os.path.dirname(regular), libraries=["pthread", "dl"])
        if self.inplace:
            self.copy_file(regular, inplace, level=self.verbose)

    def _get_output_mapping(self):
        yield from super()._get_output_mapping()
        if self.inplace:
            for package, (name, _) in DAEMONS.items():
                regular, inplace = self._daemon_paths(package, name)
                if os.path.exists(regular):
                    yield regular, inplace

    def get_outputs(self) -> list[str]:
        outputs = super().get_outputs()
        if not self.inplace:
            outputs += [p for p in (self._daemon_paths(pkg, name)[0] for pkg, (name, _) in DAEMONS.items())
                        if os.path.exists(p)]
        return outputs


setup(ext_modules=ext, cmdclass={"build_ext": build_ext_and_daemons},
      # the daemons' sources, for an sdist (the wheel carries them built)
      package_data={"clairvoyant": ["fuse/fuse_common.h", "fuse/fuse_loader.h", "cache/tier_format.h"],
                    "clairvoyant.testing": ["emufs.c"], "clairvoyant.mount": ["mountfs.c", "mount_stats.h"]})
