"""Emulated multi-host clusters for tests and benchmarks: namespaces, shaped links, rank processes."""
