"""Topology and, later, the MPI exchange between nodes."""
