"""Build of the optional C helpers; everything else is in pyproject.toml.

The extensions are optional: where they cannot be compiled, clairvoyant falls
back to the same operations in Python (slower, identical in effect; the tests
check that).
"""

import sys

from setuptools import Extension, setup

ext = [] if sys.platform != "linux" else [
    Extension("clairvoyant._fastio", ["src/clairvoyant/_fastio.c"], optional=True,
              extra_compile_args=["-O2"]),
    # staging threads in C (libxxhash-dev's header, inlined: nothing to link)
    Extension("clairvoyant.cache._stager", ["src/clairvoyant/cache/_stager.c"], optional=True,
              depends=["src/clairvoyant/cache/tier_format.h"], extra_compile_args=["-O2"]),
    Extension("clairvoyant.plan._belady", ["src/clairvoyant/plan/_belady.c"], optional=True,
              extra_compile_args=["-O2"]),
]
# the FUSE daemons are compiled from their sources on first use (clairvoyant.fusebase)
setup(ext_modules=ext, package_data={"clairvoyant": ["fuse_common.h", "cache/tier_format.h"], "clairvoyant.testing": ["emufs.c"],
                                     "clairvoyant.mount": ["mountfs.c"]})
