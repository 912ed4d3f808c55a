"""Ingest: validate contract messages and land them in the store, from MQTT or from files."""

from twin.ingest.ingester import IngestCounters, Ingester, IngestLimits

__all__ = ["IngestCounters", "IngestLimits", "Ingester"]
