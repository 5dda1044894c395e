"""Workloads: session and call records, file IO, trace importers, synthetic
presets, transforms and arrival processes. Knows nothing of engines or policies."""

from basin.workload.records import Call, RecordError, Session, Workload

__all__ = ["Call", "RecordError", "Session", "Workload"]
