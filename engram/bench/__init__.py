"""Benchmarks (`engram bench ...`): figures as ratios to a baseline measured in the same run."""
