"""Build of the optional C helper; everything else is in pyproject.toml.

The extension is optional: where it cannot be compiled, clairvoyant falls back
to the same operation in Python (slower on few cores, identical in effect).
"""

import sys

from setuptools import Extension, setup

ext = [] if sys.platform != "linux" else [
    Extension("clairvoyant.cache._fastcopy", ["src/clairvoyant/cache/_fastcopy.c"], optional=True,
              extra_compile_args=["-O2"]),
]
setup(ext_modules=ext)
