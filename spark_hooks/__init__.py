"""Tidemark's PySpark integration: session set-up, exactly-once epoch jobs, consistent reads."""
from .epoch_job import EpochJob, SparkEpochContext
from .reads import frames_at, read_consistent
from .session import build_spark_session, spark_conf

__all__ = ["EpochJob", "SparkEpochContext", "build_spark_session", "frames_at", "read_consistent", "spark_conf"]
