"""Tidemark's benchmarks: ``python -m bench [coordination|iceberg|spark ...]`` (``make bench`` runs all)."""
