"""The headroom families of /metrics as DuckDB writes them (twin.api.queries.headroom_exposition):
units in the names and scaled to them, label values escaped, only finite values, the newest
report only; parsed back by prometheus_client's own parser."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from twin.analysis.headroom import HeadroomReport, HeadroomRow
from twin.api.metrics import MetricFilter, headroom_exposition
from twin.store import Store
from twin.store.reads import save_headroom


def _row(kind: str, id_: str, quantity: str, unit: str, limit: float, value: float | None):
    h = None if value is None else limit - value
    return HeadroomRow(
        kind=kind,  # type: ignore[arg-type]
        id=id_,
        quantity=quantity,
        unit=unit,
        limit=limit,
        value_now=value,
        headroom_now=h,
        headroom_min_p50=h,
        headroom_min_p90=None if h is None else h - 1.0,
        breach_in_s_p50=None,
        breach_in_s_p90=None,
    )


def _report(at: datetime, rows: list[HeadroomRow]) -> HeadroomReport:
    return HeadroomReport(
        computed_at=at,
        data_until=at,
        horizon_s=3600.0,
        step_s=60.0,
        load_basis="persistence",
        rows=rows,
        problems=[],
    )


@pytest.fixture
def ctx(tmp_path):
    store = Store(tmp_path / "m.duckdb")
    t0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    old = [_row("rack", "r-old", "power_kw", "kW", 100.0, 10.0)]
    rows = [
        _row("gpu", 'odd"id\\with\nall', "temp_c", "K", 87.0, 80.0),
        _row("pdu_phase", "p/L1", "current_a", "A", 25.6, 20.0),
        _row("rack", "r01", "power_kw", "kW", 132.0, 99.5),
        _row("cdu", "cdu-1", "flow_lpm", "L/min", 600.0, 450.0),
        _row("link", "l1", "traffic_gbps", "Gb/s", 400.0, 100.0),
    ]
    save_headroom(store, _report(t0 - timedelta(minutes=1), old))
    save_headroom(store, _report(t0, rows))
    yield SimpleNamespace(db=lambda: store)
    store.close()


def test_units_in_names_scaled_and_labels_escaped(ctx) -> None:
    text = headroom_exposition(ctx, MetricFilter())  # type: ignore[arg-type]
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    values = {(name, s.labels["id"]): s.value for name, f in fams.items() for s in f.samples}
    assert values[("dctwin_headroom_celsius", 'odd"id\\with\nall')] == pytest.approx(7.0)
    assert values[("dctwin_headroom_limit_celsius", 'odd"id\\with\nall')] == 87.0
    assert values[("dctwin_headroom_amperes", "p/L1")] == pytest.approx(5.6)
    assert values[("dctwin_headroom_watts", "r01")] == pytest.approx(32_500.0)
    assert values[("dctwin_headroom_liters_per_second", "cdu-1")] == pytest.approx(150 / 60)
    assert values[("dctwin_headroom_bytes_per_second", "l1")] == pytest.approx(300e9 / 8)
    assert values[("dctwin_headroom_min_p90_watts", "r01")] == pytest.approx(31_500.0)
    assert values[("dctwin_headroom_ratio", "r01")] == pytest.approx(32.5 / 132.0)
    assert not any(i == "r-old" for _, i in values)  # the newest report only
    assert all(f.type == "gauge" and f.documentation for f in fams.values())


def test_a_missing_value_writes_no_sample_and_filters_apply(ctx) -> None:
    store = ctx.db()
    at = datetime(2026, 12, 3, 12, 5, tzinfo=UTC)
    save_headroom(store, _report(at, [_row("rack", "r02", "power_kw", "kW", 132.0, None)]))
    text = headroom_exposition(ctx, MetricFilter())  # type: ignore[arg-type]
    names = [f.name for f in text_string_to_metric_families(text)]
    assert names == ["dctwin_headroom_limit_watts"]  # no headroom, no ratio: only the limit
    save_headroom(
        store, _report(at + timedelta(minutes=1), [_row("rack", "r02", "power_kw", "kW", 1, 0.5)])
    )
    keep = MetricFilter.parse(["dctwin_headroom_watts"], [])
    text = headroom_exposition(ctx, keep)  # type: ignore[arg-type]
    assert [f.name for f in text_string_to_metric_families(text)] == ["dctwin_headroom_watts"]
