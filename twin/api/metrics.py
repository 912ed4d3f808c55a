"""``/metrics``: the twin's figures in the Prometheus exposition format.

A custom collector reads the store at scrape time (no background state):

========================================  ===================================================
metric                                    labels / meaning
========================================  ===================================================
``dctwin_headroom``                       kind, id, quantity, unit: headroom now, latest report
``dctwin_headroom_min_p90``               same labels: minimum over the horizon at p90 load
``dctwin_headroom_ratio``                 same labels: headroom now as a share of the limit
``dctwin_headroom_limit``                 same labels: the limit itself, in ``unit``
``dctwin_headroom_report_timestamp_seconds``  when the latest report was computed
``dctwin_ingest_messages_received_total``     messages received since the service started
``dctwin_ingest_messages_stored_total``       messages stored since the service started
``dctwin_ingest_duplicates_total``            duplicates dropped since the service started
``dctwin_ingest_dedup_lookups_total``         ingest-log lookups for messages behind their mark
``dctwin_ingest_samples_total``               kind: samples stored since the service started
``dctwin_ingest_dead_letters_total``          reason: dead letters since the service started
``dctwin_dead_letters``                       reason: dead letters kept in the store (all time)
``dctwin_newest_sample_timestamp_seconds``    kind: newest sample in the store
``dctwin_calibration_mae``                    device_class, quantity: median MAE, newest run
``dctwin_calibration_cv_rmse``                device_class, quantity: median CV(RMSE)
``dctwin_alerts_active``                      severity: open incidents
``dctwin_loop_successes_total``               loop: passes that succeeded (ingest, api, ...)
``dctwin_loop_errors_total``                  loop: passes that failed (the API: unhandled 500s)
``dctwin_loop_last_success_timestamp_seconds``  loop: Unix time of the last successful pass
``dctwin_loop_failing``                       loop: 1 while the most recent pass failed
``dctwin_broker_connected``                   1 connected, 0 not (absent before the first try)
``dctwin_broker_reconnects_total``            reconnections after a lost connection
``dctwin_broker_disconnects_total``           connections lost
``dctwin_ingest_lag_seconds``                 age of the oldest received-but-unstored message
``dctwin_ingest_last_commit_timestamp_seconds``  Unix time of the last commit
``dctwin_ingest_stalled``                     1 while /healthz answers 503 (ingest stalled)
``dctwin_telemetry_missing``                  kind: 1 for a kind a loop found without data
``dctwin_api_busy_rejected_total``            expensive requests answered 429 (no free slot)
``dctwin_api_busy_slots``                     state (in_use, limit): the API's busy slots
``dctwin_api_forecast_cache_entries``         forecast answers cached now
========================================  ===================================================

The health metrics come from the service's :class:`twin.health.ServiceHealth` (absent when
the API runs without one), the ``dctwin_api_*`` ones from the API's own limits.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from twin.api import queries

if TYPE_CHECKING:
    from twin.api.context import ApiContext
    from twin.api.guard import BusyLimit, LruCache

log = logging.getLogger(__name__)


def _ok(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


class StoreCollector(Collector):
    """Collects the metrics in the module docstring from an :class:`ApiContext`."""

    def __init__(self, ctx: ApiContext, active_alerts: object) -> None:
        self.ctx = ctx
        self.active_alerts = active_alerts  # () -> list of active incident dicts

    def collect(self) -> Iterator[Metric]:
        db = self.ctx.db()
        labels = ["kind", "id", "quantity", "unit"]
        now_g = GaugeMetricFamily(
            "dctwin_headroom",
            "Headroom to the limit now (limit - value), in `unit`.",
            labels=labels,
        )
        p90_g = GaugeMetricFamily(
            "dctwin_headroom_min_p90",
            "Smallest headroom over the forecast horizon at the p90 load, in `unit`.",
            labels=labels,
        )
        ratio_g = GaugeMetricFamily(
            "dctwin_headroom_ratio",
            "Headroom now as a share of the limit (0: at the limit, negative: past it), so that"
            " limits of different units rank together.",
            labels=labels,
        )
        limit_g = GaugeMetricFamily(
            "dctwin_headroom_limit",
            "The limit the headroom is measured to, in `unit`.",
            labels=labels,
        )
        computed_at, _, rows = queries.headroom_latest(db)
        for r in rows:
            lv = [r["kind"], r["id"], r["quantity"], r["unit"]]
            if _ok(r["headroom_now"]):
                now_g.add_metric(lv, r["headroom_now"])
                if _ok(r["limit"]) and r["limit"] != 0:
                    ratio_g.add_metric(lv, r["headroom_now"] / abs(r["limit"]))
            if _ok(r["headroom_min_p90"]):
                p90_g.add_metric(lv, r["headroom_min_p90"])
            if _ok(r["limit"]):
                limit_g.add_metric(lv, r["limit"])
        yield now_g
        yield p90_g
        yield ratio_g
        yield limit_g
        ts_g = GaugeMetricFamily(
            "dctwin_headroom_report_timestamp_seconds",
            "Unix time the latest headroom report was computed.",
        )
        if computed_at is not None:
            ts_g.add_metric([], computed_at.timestamp())
        yield ts_g

        ing = self.ctx.ingester
        if ing is not None:
            c = ing.counters
            for name, value, doc in (
                ("received", c.received, "MQTT messages received by the ingest."),
                ("stored", c.stored_messages, "Messages stored in the store."),
                ("foreign", c.foreign, "Messages of another shard's sources, not stored."),
            ):
                yield CounterMetricFamily(f"dctwin_ingest_messages_{name}", doc, value=float(value))
            yield CounterMetricFamily(
                "dctwin_ingest_duplicates", "Duplicate messages dropped.", value=c.duplicates
            )
            yield CounterMetricFamily(
                "dctwin_ingest_dedup_lookups",
                "Ingest-log lookups for messages behind their stream's high-water mark.",
                value=c.dedup_lookups,
            )
            s = CounterMetricFamily(
                "dctwin_ingest_samples", "Samples stored, per kind.", labels=["kind"]
            )
            for kind, n in sorted(dict(c.samples).items()):
                s.add_metric([kind], float(n))
            yield s
            d = CounterMetricFamily(
                "dctwin_ingest_dead_letters",
                "Messages refused since the service started, per reason.",
                labels=["reason"],
            )
            for reason, n in sorted(dict(c.dead_letters).items()):
                d.add_metric([reason], float(n))
            yield d
        stored = GaugeMetricFamily(
            "dctwin_dead_letters", "Dead letters kept in the store, per reason.", labels=["reason"]
        )
        for reason, n in db.con.execute(
            "SELECT reason, count(*) FROM dead_letters GROUP BY reason ORDER BY reason"
        ).fetchall():
            stored.add_metric([reason], float(n))
        yield stored
        newest = GaugeMetricFamily(
            "dctwin_newest_sample_timestamp_seconds",
            "Unix time of the newest sample in the store, per kind.",
            labels=["kind"],
        )
        for kind, ts in queries.newest_all(db).items():
            if ts is not None:
                newest.add_metric([kind], ts.timestamp())
        yield newest

        mae = GaugeMetricFamily(
            "dctwin_calibration_mae",
            "Median held-out MAE of the newest calibration, in the quantity's unit.",
            labels=["device_class", "quantity"],
        )
        cv = GaugeMetricFamily(
            "dctwin_calibration_cv_rmse",
            "Median held-out CV(RMSE) of the newest calibration (a fraction).",
            labels=["device_class", "quantity"],
        )
        for cls, quantity, m, c_ in queries.calibration_quality(db, self.ctx.site):
            if _ok(m):
                mae.add_metric([cls, quantity], m)  # type: ignore[arg-type]
            if _ok(c_):
                cv.add_metric([cls, quantity], c_)  # type: ignore[arg-type]
        yield mae
        yield cv

        alerts = GaugeMetricFamily(
            "dctwin_alerts_active", "Open alert incidents, per severity.", labels=["severity"]
        )
        counts: dict[str, int] = {"critical": 0, "warning": 0, "info": 0}
        for a in self.active_alerts():  # type: ignore[operator]
            counts[a["severity"]] = counts.get(a["severity"], 0) + 1
        for sev, n in counts.items():
            alerts.add_metric([sev], float(n))
        yield alerts


def _ts(value: str | None) -> float | None:
    return None if value is None else datetime.fromisoformat(value).timestamp()


class HealthCollector(Collector):
    """The health and API-limit metrics of the module docstring."""

    def __init__(self, ctx: ApiContext, busy: BusyLimit, forecast_cache: LruCache) -> None:
        self.ctx = ctx
        self.busy = busy
        self.forecast_cache = forecast_cache

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "dctwin_api_busy_rejected",
            "Expensive API requests answered 429 because every busy slot was taken.",
            value=float(self.busy.rejected_total),
        )
        slots = GaugeMetricFamily(
            "dctwin_api_busy_slots", "The API's slots for expensive requests.", labels=["state"]
        )
        slots.add_metric(["in_use"], float(self.busy.in_use))
        slots.add_metric(["limit"], float(self.busy.slots))
        yield slots
        yield GaugeMetricFamily(
            "dctwin_api_forecast_cache_entries",
            "Forecast answers held in the API's cache.",
            value=float(len(self.forecast_cache)),
        )
        health = self.ctx.health
        if health is None:
            return
        snap = health.snapshot()
        loops = snap["loops"]
        ok_c = CounterMetricFamily(
            "dctwin_loop_successes", "Passes of a background loop that succeeded.", labels=["loop"]
        )
        err_c = CounterMetricFamily(
            "dctwin_loop_errors", "Passes of a background loop that failed.", labels=["loop"]
        )
        last = GaugeMetricFamily(
            "dctwin_loop_last_success_timestamp_seconds",
            "Unix time of a loop's last successful pass.",
            labels=["loop"],
        )
        failing = GaugeMetricFamily(
            "dctwin_loop_failing", "1 while a loop's most recent pass failed.", labels=["loop"]
        )
        for name, lp in loops.items():
            ok_c.add_metric([name], float(lp["successes_total"]))
            err_c.add_metric([name], float(lp["errors_total"]))
            t = _ts(lp["last_success"])
            if t is not None:
                last.add_metric([name], t)
            failing.add_metric([name], 1.0 if lp["failing"] else 0.0)
        yield ok_c
        yield err_c
        yield last
        yield failing
        b = snap["broker"]
        conn = GaugeMetricFamily(
            "dctwin_broker_connected", "1 while the ingest is connected to the MQTT broker."
        )
        if b["connected"] is not None:
            conn.add_metric([], 1.0 if b["connected"] else 0.0)
        yield conn
        yield CounterMetricFamily(
            "dctwin_broker_reconnects",
            "Reconnections to the broker after a lost connection.",
            value=float(b["reconnects"]),
        )
        yield CounterMetricFamily(
            "dctwin_broker_disconnects",
            "Connections to the broker lost.",
            value=float(b["disconnects"]),
        )
        yield GaugeMetricFamily(
            "dctwin_ingest_lag_seconds",
            "Age of the oldest received-but-unstored message (0: none waits).",
            value=float(snap["ingest_lag_s"]),
        )
        commit = GaugeMetricFamily(
            "dctwin_ingest_last_commit_timestamp_seconds",
            "Unix time of the last commit of received messages.",
        )
        t = _ts(snap["last_commit_at"])
        if t is not None:
            commit.add_metric([], t)
        yield commit
        yield GaugeMetricFamily(
            "dctwin_ingest_stalled",
            "1 while ingest is stalled (/healthz answers 503).",
            value=1.0 if snap["stalled"] else 0.0,
        )
        missing = GaugeMetricFamily(
            "dctwin_telemetry_missing",
            "1 for a telemetry kind a loop found without data.",
            labels=["kind"],
        )
        for kind in snap["missing_telemetry"]:
            missing.add_metric([kind], 1.0)
        yield missing
