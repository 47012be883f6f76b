"""``clairvoyant mount``: the data set as a read-only FUSE file system for programs that open files by
path, reading from the node's local tier and staging ahead in the order a sampler publishes
(docs/mount.md)."""

from .fs import Mount, MountStats, mount_available, read_info, read_stats

__all__ = ["Mount", "MountStats", "mount_available", "read_info", "read_stats"]
