"""The mounts of a job's nodes as one cache (``clairvoyant mount --cluster``, docs/mount.md): this
node's part (node.py: homes, peers' reads, staging ahead), its link to the others (links.py, the
``ClusterLink`` it needs), the orders the nodes exchange (orders.py) and plan by (plan.py, or
ahead.py without every node's), the handoff of peers' files to the daemon (handoff.py), the homes
file (homes.py), and the member a launcher runs beside the node's service (member.py)."""

from .node import MountCluster

__all__ = ["MountCluster"]
