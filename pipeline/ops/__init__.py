"""Operator tools: up, demo, tail, produce, inspect, rescale."""
