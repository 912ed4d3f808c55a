"""The alert engine's tables: :mod:`twin.store.alerts` owns them and their statements (every SQL
statement outside the API's query module lives in ``twin/store``); this module keeps the alert
package's names for them."""

from __future__ import annotations

from twin.store.alerts import AlertDb, ensure_alert_tables

__all__ = ["AlertDb", "ensure_alert_tables"]
