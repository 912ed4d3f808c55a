"""``/metrics``: the twin's figures in the Prometheus exposition format.

A custom collector reads the store at scrape time (no background state):

========================================  ===================================================
metric                                    labels / meaning
========================================  ===================================================
``dctwin_headroom_<unit>``                kind, id, quantity: headroom now (limit - value),
                                          latest report, in the family's unit
``dctwin_headroom_min_p90_<unit>``        same labels: minimum over the horizon at p90 load
``dctwin_headroom_limit_<unit>``          same labels: the limit itself (°C for temperatures)
``dctwin_headroom_ratio``                 same labels: headroom now as a share of the limit
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

``<unit>`` is the Prometheus base unit of the limit (:data:`HEADROOM_UNITS`): ``celsius``
(GPU and loop temperatures; a headroom in K is a difference of °C), ``amperes`` (PDU phases and
breakers), ``watts`` (racks, CDU heat), ``liters_per_second`` (CDU flow),
``bytes_per_second`` (links); no unit is ever a label. The headroom families are written by
DuckDB (:func:`twin.api.queries.headroom_exposition`): a 25,000-GPU shard's ~150,000 samples
would take Python's client seconds a scrape.

``/metrics?name[]=NAME`` (repeatable; a family's name or one of its samples', as
prometheus_client's own handler) and ``match[]=SELECTOR`` (``NAME``, ``{__name__="NAME"}`` or
``{__name__=~"REGEX"}``, as Prometheus' federation) keep only the families named: a scraper of a
large shard takes what it graphs (:class:`MetricFilter`).

The health metrics come from the service's :class:`twin.health.ServiceHealth` (absent when
the API runs without one), the ``dctwin_api_*`` ones from the API's own limits.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from twin.api import queries

if TYPE_CHECKING:
    from twin.api.context import ApiContext
    from twin.api.guard import BusyLimit, LruCache

log = logging.getLogger(__name__)


#: Per unit of the headroom rows (``twin.analysis.headroom``): the Prometheus base unit its
#: families are named with, and the factor from the row's unit to it (Prometheus naming practice,
#: "Base units": https://prometheus.io/docs/practices/naming/#base-units).
HEADROOM_UNITS: dict[str, tuple[str, float]] = {
    "K": ("celsius", 1.0),  # a temperature difference: K = °C; the limit itself is in °C
    "A": ("amperes", 1.0),
    "kW": ("watts", 1000.0),
    "L/min": ("liters_per_second", 1.0 / 60.0),
    "Gb/s": ("bytes_per_second", 1e9 / 8.0),
}

#: The headroom families per unit: (name prefix, value of queries.HEADROOM_VALUES, help).
HEADROOM_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("dctwin_headroom", "headroom_now", "Headroom to the limit now (limit - value)"),
    (
        "dctwin_headroom_min_p90",
        "headroom_min_p90",
        "Smallest headroom over the forecast horizon at the p90 load",
    ),
    ("dctwin_headroom_limit", "limit", "The limit the headroom is measured to"),
)

RATIO_FAMILY = "dctwin_headroom_ratio"


def headroom_family_names() -> list[str]:
    """Every headroom family name /metrics may carry."""
    names = [f"{p}_{u}" for p, _, _ in HEADROOM_FAMILIES for u, _ in HEADROOM_UNITS.values()]
    return [*names, RATIO_FAMILY]


_SELECTOR = re.compile(
    r'^(?:(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)|\{__name__(?P<op>=~|=)"(?P<value>(?:[^"\\]|\\.)*)"\})$'
)


class FilterError(ValueError):
    """A ``match[]`` selector /metrics cannot apply."""


@dataclass(frozen=True)
class MetricFilter:
    """Which families /metrics writes: all, or those ``name[]`` or ``match[]`` keep (any)."""

    names: frozenset[str] = frozenset()
    patterns: tuple[re.Pattern[str], ...] = ()

    @classmethod
    def parse(cls, names: Iterable[str], matches: Iterable[str]) -> MetricFilter:
        patterns = []
        for sel in matches:
            m = _SELECTOR.match(sel.strip())
            if m is None:
                raise FilterError(
                    f'match[]={sel!r}: expected NAME, {{__name__="NAME"}} or {{__name__=~"REGEX"}}'
                )
            if m.group("name"):
                patterns.append(re.compile(re.escape(m.group("name"))))
            elif m.group("op") == "=":
                patterns.append(re.compile(re.escape(m.group("value"))))
            else:
                try:
                    patterns.append(re.compile(m.group("value")))
                except re.error as e:
                    raise FilterError(f"match[]={sel!r}: not a regular expression ({e})") from None
        return cls(frozenset(n for n in names if n), tuple(patterns))

    @property
    def everything(self) -> bool:
        return not self.names and not self.patterns

    def keeps(self, name: str, sample_names: Iterable[str] = ()) -> bool:
        if self.everything:
            return True
        if name in self.names or any(s in self.names for s in sample_names):
            return True
        return any(p.fullmatch(name) for p in self.patterns)


def headroom_exposition(ctx: ApiContext, keep: MetricFilter) -> str:
    """The headroom families of the latest report as Prometheus text (HELP, TYPE, samples)."""
    db = ctx.db()
    computed_at = queries.headroom_computed_at(db)
    if computed_at is None:
        return ""
    helps: dict[str, str] = {}
    branches: list[tuple[str, str, str, float]] = []
    for prefix, value, doc in HEADROOM_FAMILIES:
        for unit, (suffix, scale) in HEADROOM_UNITS.items():
            name = f"{prefix}_{suffix}"
            if keep.keeps(name):
                helps[name] = f"{doc}, in {suffix.replace('_', ' ')}."
                branches.append((name, value, unit, scale))
    if keep.keeps(RATIO_FAMILY):
        helps[RATIO_FAMILY] = (
            "Headroom now as a share of the limit (0: at the limit, negative: past it), so that"
            " limits of different units rank together."
        )
        branches.append((RATIO_FAMILY, "ratio", "", 1.0))
    out = []
    for name, lines in queries.headroom_exposition(db, computed_at, branches):
        out.append(f"# HELP {name} {helps[name]}\n# TYPE {name} gauge\n{lines}\n")
    return "".join(out)


class FilteredRegistry:
    """A registry's families that ``keep`` keeps (what ``generate_latest`` reads)."""

    def __init__(self, registry: Collector, keep: MetricFilter) -> None:
        self.registry, self.keep = registry, keep

    def collect(self) -> Iterator[Metric]:
        for metric in self.registry.collect():
            if self.keep.keeps(metric.name, (s.name for s in metric.samples)):
                yield metric


def _ok(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


class StoreCollector(Collector):
    """Collects the metrics in the module docstring from an :class:`ApiContext`."""

    def __init__(self, ctx: ApiContext, active_alerts: object) -> None:
        self.ctx = ctx
        self.active_alerts = active_alerts  # () -> list of active incident dicts

    def collect(self) -> Iterator[Metric]:
        db = self.ctx.db()
        computed_at = queries.headroom_computed_at(db)
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
        for reason, n in queries.dead_letter_counts(db):
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
