"""Readers, collation, shared-memory batches and the Loader."""
