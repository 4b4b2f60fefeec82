"""From a blob URL to a store: one constructor per scheme (MLflow's artifact registry)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from services.common.blobstore.port import BlobStore
from services.common.errors import InvalidArgument


def _file(url: str, **_options: Any) -> BlobStore:
    from services.common.blobstore.file import FileBlobStore

    return FileBlobStore.from_url(url)


def _s3(url: str, **options: Any) -> BlobStore:
    from services.common.blobstore.s3 import S3BlobStore

    return S3BlobStore.from_url(url, **{k: v for k, v in options.items() if v is not None})


_SCHEMES: dict[str, Callable[..., BlobStore]] = {"file": _file, "s3": _s3}


def register_scheme(scheme: str, factory: Callable[..., BlobStore]) -> None:
    """Add a scheme (tests, plugins); ``factory(url, **options)`` builds the store."""
    _SCHEMES[scheme] = factory


def blob_store_from_url(url: str, **options: Any) -> BlobStore:
    """``file:///dir`` or ``s3://bucket/prefix``; S3 options: endpoint_url, region_name,
    access_key_id, secret_access_key, part_size. file:// ignores options."""
    scheme = urlparse(url).scheme
    factory = _SCHEMES.get(scheme)
    if factory is None:
        raise InvalidArgument(
            f"unsupported blob store URL {url!r}: use one of "
            + ", ".join(f"{s}://" for s in sorted(_SCHEMES)),
            reason="UNSUPPORTED_BLOB_URL",
        )
    return factory(url, **options)
