"""MECHANISM: finding the job's layout (topology.py) and the MPI exchange between nodes (cluster.py; mpi.py for
start-up; the peer service: peers.py, its thread peer_thread.py, its wire wire.py)."""
