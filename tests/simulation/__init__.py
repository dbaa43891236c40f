"""A deterministic simulation of the worker against a model of the broker (see docs/reliability.md)."""
