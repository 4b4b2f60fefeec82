"""Engram services: each subpackage runs as its own process (`python -m services.<name>`)."""
