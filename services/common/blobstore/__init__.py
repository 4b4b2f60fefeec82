"""Blob stores behind one small port, chosen by URL scheme (file://, s3://).

Modelled on MLflow's artifact repositories: a handful of abstract methods, one
concrete class per scheme, a registry from scheme to class. Keys are relative,
``/``-separated paths; implementations refuse traversal (``..``, absolute keys).
"""

from services.common.blobstore.port import BlobInfo, BlobStore, validate_key, validate_new_key
from services.common.blobstore.registry import blob_store_from_url, register_scheme

__all__ = ["BlobInfo", "BlobStore", "blob_store_from_url", "register_scheme", "validate_key",
           "validate_new_key"]
