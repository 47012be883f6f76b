"""MECHANISM: the job as a cluster, for the Loader and the mount alike: the job's layout
(topology.py), the ranks' exchanges (group.py, mpi.py, store.py), the nodes as one cache and its
transport (job.py), the peer service (peers.py, its thread peer_thread.py, its wires wire.py,
wire_mpi.py, wire_zmq.py) and the job's secret that lets no one else in (secret.py)."""
