"""Rows of the benchmarks kept in modules of their own (``make bench`` runs only ``bench/*.py``)."""
