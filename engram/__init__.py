"""Engram: durable, verifiable memory for fleets of AI agents (client side)."""

__version__ = "0.1.0"
