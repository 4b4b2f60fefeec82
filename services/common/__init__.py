"""The runtime every Engram service shares: server wiring, auth, errors, storage ports."""
