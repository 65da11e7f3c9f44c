"""The Iceberg side: catalog settings and loading, the snapshot-summary keys Tidemark writes and
reads, staging and publishing a snapshot (with the fencing requirement), the progress a job
resumes from, and the file bookkeeping garbage collection needs.

Imports only the foundation (``coordinator.errors``, ``names``, ``records``), never ZooKeeper:
what is stored in Iceberg must be readable without a coordinator.
"""
