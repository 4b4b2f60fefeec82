"""The compactor's S3 settings: the artifacts service's names, the compactor's first names, and
credentials given as settings rather than only through boto3's own chain."""

from __future__ import annotations

import boto3
import pytest

from services.common.blobstore.registry import blob_store_from_url
from services.compactor.settings import CompactorSettings


def test_the_artifacts_services_s3_names_work_here_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_COMPACTOR_S3_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("ENGRAM_COMPACTOR_S3_REGION", "eu-west-1")
    monkeypatch.setenv("ENGRAM_COMPACTOR_S3_ACCESS_KEY_ID", "key-id")
    monkeypatch.setenv("ENGRAM_COMPACTOR_S3_SECRET_ACCESS_KEY", "secret")
    assert CompactorSettings().blob_store_options() == {
        "endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1",
        "access_key_id": "key-id", "secret_access_key": "secret"}


def test_the_first_names_still_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_COMPACTOR_BLOB_ENDPOINT_URL", "http://127.0.0.1:9001")
    monkeypatch.setenv("ENGRAM_COMPACTOR_BLOB_REGION", "us-east-1")
    settings = CompactorSettings()
    assert (settings.blob_endpoint_url, settings.blob_region) == ("http://127.0.0.1:9001",
                                                                  "us-east-1")
    by_name = CompactorSettings(blob_endpoint_url="http://127.0.0.1:9002", blob_region="x")
    assert (by_name.blob_endpoint_url, by_name.blob_region) == ("http://127.0.0.1:9002", "x")


def test_credentials_in_the_settings_reach_s3(monkeypatch: pytest.MonkeyPatch,
                                              moto_endpoint: str) -> None:
    """With no AWS_* variables and no profile, the keys given as settings are the ones used
    (before, the compactor had no such settings: boto3 found no credentials)."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1",
                 aws_access_key_id="k", aws_secret_access_key="s").create_bucket(Bucket="cold")
    settings = CompactorSettings(blob_url="s3://cold/compactor",
                                 blob_endpoint_url=moto_endpoint, blob_region="us-east-1",
                                 s3_access_key_id="k", s3_secret_access_key="s")
    store = blob_store_from_url(settings.blob_store_url(), **settings.blob_store_options())
    try:
        store.put("snapshots/1", [b"a cold snapshot"])
        assert b"".join(store.open("snapshots/1")) == b"a cold snapshot"
    finally:
        store.close()
