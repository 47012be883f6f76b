"""Command line: thin wrappers over the library."""
