"""MECHANISM: what clairvoyant's two FUSE daemons share. ``daemon.py``: find the executable the
package's build made (nothing is compiled at run time), mount, wait, tear down; ``fuse_common.h``:
their C stubs and parent watch; ``fuse_loader.h``: libfuse3 loaded at run time. The daemons
themselves live with what they serve: ``mount/mountfs.c`` and ``testing/emufs.c``."""
