"""The object-store credentials ``tidemark serve`` vends with a table: short-lived ones that can only read that table's
files (STS), or, when the operator says so, the backing catalog's own keys.

    vending = CredentialVending(Vending.STS, duration_s=3600)       # or CredentialVending(Vending.STATIC)
    vending.for_table(table.io.properties, "s3://lake/db/orders")
    # {"s3.access-key-id": "ASIA...", "s3.secret-access-key": ..., "s3.session-token": ...}

STS: ``AssumeRole`` at the object store's STS endpoint (the table's ``s3.endpoint``, where SeaweedFS, MinIO and Ceph
RGW serve it; AWS's own without one), signed with the backing catalog's keys (else botocore's default chain, such as
a Kubernetes service account's web identity), with a session policy that allows ``s3:GetObject`` under the table's
location and ``s3:ListBucket`` of that prefix, nothing else. AWS and Ceph need ``role_arn``; SeaweedFS and MinIO
assume the caller's own identity without one. The credentials of a location are kept until a quarter of their life
is left: STS is asked once per table every three quarters of ``duration_s``, not per load.

Failure behaviour: ``for_table`` raises ``StorageError`` saying what to do when the store issues no credentials (no
STS, a role that may not be assumed, a duration it refuses) or STS is unreachable within ``STS_TIMEOUT_S``; a table
that is not on S3 gets no credentials.
"""
from __future__ import annotations

import enum
import json
import threading
import time
from collections.abc import Mapping
from typing import Any, Optional
from urllib.parse import urlsplit

from coordinator.errors import StorageError

STS_TIMEOUT_S = 10.0  # one STS request: connecting and the answer (each of its two attempts)
DEFAULT_DURATION_S = 3600  # how long vended STS credentials last: an engine's longest scan (AWS allows 900 to 43200)
REFRESH_LEFT = 0.25  # credentials with less than this share of their life left are replaced
KEYS = ("s3.access-key-id", "s3.secret-access-key", "s3.session-token")  # what a table's config vends, every engine's
SESSION_NAME = "tidemark-serve"


class Vending(enum.Enum):
    """What a table's storage credentials are: short-lived and read-only (``sts``), or the catalog's own keys."""

    STS = "sts"
    STATIC = "static"


class CredentialVending:
    """The credentials a table's config carries for a client that may have them (module docstring).

    :param mode: STS credentials scoped to the table, or the backing catalog's own keys.
    :param role_arn: the role STS credentials are issued for (AWS and Ceph need one; None: the caller's own identity).
    :param duration_s: how long STS credentials last, in seconds.
    :param endpoint: the STS endpoint (default: the table's ``s3.endpoint``; AWS's regional one without).
    """

    mode: Vending
    role_arn: Optional[str]
    duration_s: int
    endpoint: Optional[str]

    def __init__(self, mode: Vending = Vending.STS, *, role_arn: Optional[str] = None,
                 duration_s: int = DEFAULT_DURATION_S, endpoint: Optional[str] = None) -> None:
        self.mode, self.role_arn, self.duration_s, self.endpoint = mode, role_arn, duration_s, endpoint
        self._issued: dict[str, tuple[float, dict[str, str]]] = {}  # location -> (replace after, credentials)
        self._clients: dict[tuple, Any] = {}  # (endpoint, region, keys) -> botocore's STS client
        self._lock = threading.Lock()

    def describe(self) -> str:
        """What is vended, in words (the start-up line says it)."""
        if self.mode == Vending.STATIC:
            return "the backing catalog's own keys (--vend-credentials static)"
        return f"read-only STS credentials for the table's files, {self.duration_s} s"

    def for_table(self, io_properties: Mapping[str, str], location: str) -> dict[str, str]:
        """The credentials under pyiceberg's and Iceberg Java's names (``s3.access-key-id``, ``s3.secret-access-key``,
        ``s3.session-token``) that read the table at ``location``; none for a table not on S3.

        :param io_properties: the table's FileIO properties (its endpoint, region and the catalog's keys).
        :param location: the table's location, ``s3://bucket/path``.
        :raises StorageError: the object store issued no credentials (module docstring).
        """
        where = urlsplit(location)
        if where.scheme not in ("s3", "s3a"):
            return {}
        if self.mode == Vending.STATIC:
            return {k: str(io_properties[k]) for k in KEYS if io_properties.get(k)}
        now = time.monotonic()
        with self._lock:
            issued = self._issued.get(location)
        if issued is not None and issued[0] > now:
            return issued[1]
        credentials, lasts_s = self._assume_role(io_properties, where.netloc, where.path.strip("/"))
        with self._lock:
            self._issued[location] = (now + lasts_s * (1 - REFRESH_LEFT), credentials)
        return credentials

    def _assume_role(self, io: Mapping[str, str], bucket: str, prefix: str) -> tuple[dict[str, str], float]:
        """Credentials that read ``bucket/prefix/`` and list that prefix, and how many seconds they last."""
        from botocore.exceptions import BotoCoreError, ClientError
        under = f"{prefix}/" if prefix else ""
        policy = {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [f"arn:aws:s3:::{bucket}/{under}*"]},
            {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [f"arn:aws:s3:::{bucket}"],
             "Condition": {"StringLike": {"s3:prefix": [f"{under}*"]}}}]}
        request: dict[str, Any] = {"RoleSessionName": SESSION_NAME, "DurationSeconds": self.duration_s,
                                   "Policy": json.dumps(policy)}
        if self.role_arn:
            request["RoleArn"] = self.role_arn
        endpoint = self.endpoint or io.get("s3.endpoint") or None
        try:
            answer = self._client(endpoint, io).assume_role(**request)["Credentials"]
        except ClientError as exc:
            error = exc.response.get("Error", {})
            raise StorageError(f"the object store's STS ({endpoint or 'AWS'}) issued no credentials for "
                               f"s3://{bucket}/{prefix}: {error.get('Code')}: {error.get('Message')}; give "
                               "--sts-role-arn a role the backing catalog's keys may assume, or --vend-credentials "
                               "static to vend those keys themselves") from None
        except BotoCoreError as exc:
            raise StorageError(f"the object store's STS ({endpoint or 'AWS'}) cannot be reached: {exc}; "
                               "retry") from None
        lasts_s = max(0.0, answer["Expiration"].timestamp() - time.time())
        return {"s3.access-key-id": answer["AccessKeyId"], "s3.secret-access-key": answer["SecretAccessKey"],
                "s3.session-token": answer["SessionToken"]}, lasts_s

    def _client(self, endpoint: Optional[str], io: Mapping[str, str]) -> Any:
        """The STS client for ``endpoint`` signed with the table's keys (else botocore's default chain), made once:
        making one reads botocore's service models, a second or more."""
        import botocore.session
        from botocore.config import Config
        region = io.get("s3.region") or io.get("client.region") or "us-east-1"
        keys = (io.get("s3.access-key-id") or None, io.get("s3.secret-access-key") or None,
                io.get("s3.session-token") or None)
        with self._lock:
            client = self._clients.get((endpoint, region, keys))
            if client is None:
                # Without a role, boto's model refuses the call; SeaweedFS and MinIO take it as the caller's own.
                config = Config(connect_timeout=STS_TIMEOUT_S, read_timeout=STS_TIMEOUT_S,
                                retries={"total_max_attempts": 2}, parameter_validation=self.role_arn is not None)
                client = self._clients[(endpoint, region, keys)] = botocore.session.get_session().create_client(
                    "sts", endpoint_url=endpoint, region_name=region, config=config, aws_access_key_id=keys[0],
                    aws_secret_access_key=keys[1], aws_session_token=keys[2])
            return client


__all__ = ["CredentialVending", "Vending"]
