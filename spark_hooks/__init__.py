"""Tidemark's PySpark integration: session set-up, exactly-once epoch jobs, consistent reads."""
from .epoch_job import EpochContext, EpochJob
from .reads import frames_at, read_consistent, snapshot_sql
from .session import build_spark_session, spark_conf

__all__ = ["EpochContext", "EpochJob", "build_spark_session", "frames_at", "read_consistent", "snapshot_sql",
           "spark_conf"]
