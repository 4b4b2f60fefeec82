"""A versioned bucket in moto's in-process S3, and Engram's blob store over it: where a plain
delete only hides an object's bytes behind a delete marker, so every purge must sweep versions."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
from moto import mock_aws

from services.common.blobstore import blob_store_from_url
from services.common.blobstore.s3 import S3BlobStore

BUCKET = "engram-test"


@contextmanager
def versioned_store(bucket: str = BUCKET) -> Iterator[tuple[Any, S3BlobStore]]:
    """(boto3 client, store under the prefix ``engram``), both gone on exit."""
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=bucket)
        client.put_bucket_versioning(Bucket=bucket,
                                     VersioningConfiguration={"Status": "Enabled"})
        store = blob_store_from_url(f"s3://{bucket}/engram", region_name="us-east-1",
                                    access_key_id="test", secret_access_key="test")
        assert isinstance(store, S3BlobStore)
        try:
            yield client, store
        finally:
            store.close()
