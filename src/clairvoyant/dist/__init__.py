"""MECHANISM: finding the job's layout (topology.py) and the MPI exchange between nodes (cluster.py, peers.py)."""
