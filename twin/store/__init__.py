"""The DuckDB store: typed tables per kind, dead letters, unknown ids, rollups, export."""

from twin.store.store import Batch, Store, StoreError

__all__ = ["Batch", "Store", "StoreError"]
