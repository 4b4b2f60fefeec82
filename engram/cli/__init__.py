"""The `engram` command line."""
