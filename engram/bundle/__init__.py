"""Bundles: one fleet's state in one verifiable file (``engram export`` / ``import-bundle``)."""

from engram.bundle.format import (
    FORMAT,
    BundleError,
    BundleReader,
    BundleWriter,
    Manifest,
    Member,
)

__all__ = ["FORMAT", "BundleError", "BundleReader", "BundleWriter", "Manifest", "Member"]
