"""The compactor's S3 settings: the artifacts service's names, the compactor's first names, and
credentials given as settings rather than only through boto3's own chain."""

from __future__ import annotations

import boto3
import pytest

from services.artifacts.settings import ArtifactsSettings
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
    by_name = CompactorSettings(s3_endpoint_url="http://127.0.0.1:9002", s3_region="x")
    assert (by_name.s3_endpoint_url, by_name.s3_region) == ("http://127.0.0.1:9002", "x")


def test_the_first_names_still_work_and_the_new_ones_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_COMPACTOR_BLOB_ENDPOINT_URL", "http://127.0.0.1:9001")
    monkeypatch.setenv("ENGRAM_COMPACTOR_BLOB_REGION", "us-east-1")
    settings = CompactorSettings()
    assert (settings.s3_endpoint_url, settings.s3_region) == ("http://127.0.0.1:9001",
                                                              "us-east-1")
    monkeypatch.setenv("ENGRAM_COMPACTOR_S3_ENDPOINT_URL", "http://127.0.0.1:9003")
    assert CompactorSettings().s3_endpoint_url == "http://127.0.0.1:9003"


def test_names_without_the_services_prefix_are_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A review found the first version reading a bare BLOB_ENDPOINT_URL (any container's
    variable), ahead of the compactor's own: cold segments sent to another endpoint."""
    for name, value in (("BLOB_ENDPOINT_URL", "http://elsewhere"), ("BLOB_REGION", "x"),
                        ("S3_ENDPOINT_URL", "http://elsewhere"), ("S3_REGION", "x"),
                        ("blob_endpoint_url", "http://elsewhere")):
        monkeypatch.setenv(name, value)
    settings = CompactorSettings()
    assert (settings.s3_endpoint_url, settings.s3_region) == (None, None)


@pytest.mark.parametrize("settings_type", [CompactorSettings, ArtifactsSettings])
def test_the_secret_key_is_never_shown_and_one_key_alone_is_refused(
        settings_type: type[CompactorSettings] | type[ArtifactsSettings]) -> None:
    settings = settings_type(s3_access_key_id="key-id", s3_secret_access_key="s3cr3t-value")
    assert "s3cr3t-value" not in repr(settings)
    assert "s3cr3t-value" not in settings.model_dump_json()
    assert settings.blob_store_options()["secret_access_key"] == "s3cr3t-value"
    prefix = "ENGRAM_COMPACTOR_" if settings_type is CompactorSettings else "ENGRAM_ARTIFACTS_"
    for alone in ({"s3_access_key_id": "key-id"}, {"s3_secret_access_key": "s3cr3t-value"}):
        with pytest.raises(ValueError, match=f"set both {prefix}S3_ACCESS_KEY_ID and "
                           f"{prefix}S3_SECRET_ACCESS_KEY, or neither"):
            settings_type(**alone).blob_store_options()  # type: ignore[arg-type]


def test_credentials_in_the_settings_reach_s3(monkeypatch: pytest.MonkeyPatch,
                                              moto_endpoint: str) -> None:
    """The keys given as settings are the ones the store signs with (before, the compactor had
    no such settings: only boto3's own chain gave it keys)."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
                 "AWS_ROLE_ARN", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1",
                 aws_access_key_id="k", aws_secret_access_key="s").create_bucket(Bucket="cold")
    settings = CompactorSettings(blob_url="s3://cold/compactor",
                                 s3_endpoint_url=moto_endpoint, s3_region="us-east-1",
                                 s3_access_key_id="key-of-the-settings",
                                 s3_secret_access_key="s")
    store = blob_store_from_url(settings.blob_store_url(), **settings.blob_store_options())
    try:
        assert store.client.meta.region_name == "us-east-1"
        credentials = store.client._request_signer._credentials  # what every request signs with
        assert credentials.access_key == "key-of-the-settings"
        store.put("snapshots/1", [b"a cold snapshot"])
        assert b"".join(store.open("snapshots/1")) == b"a cold snapshot"
    finally:
        store.close()


@pytest.mark.parametrize("days", ["365000", "inf", "nan", "-1"])
def test_a_schedule_age_no_policy_takes_stops_the_start(days: str) -> None:
    """A policy's age is at most 100,000 days (check_policy_days); a schedule set past it
    started, then every pass was refused (found by review on 2026-11-30)."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="memory_older_than_days"):
        CompactorSettings(memory_older_than_days=days)
    assert CompactorSettings(memory_older_than_days="100000").memory_older_than_days == 100_000
