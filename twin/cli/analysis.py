"""The twin's answers: `dctwin headroom`, `hotspots`, `fleets` and `forecast`, read from a
running service's API (``--api URL``, ``DCTWIN_API_URL``) or computed on a store file (``--db``),
in the same rows and columns either way (:mod:`twin.cli.source`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from twin.bands import BAND_STYLE, TEMPERATURE_UNITS, Band, bands
from twin.cli.common import DEMO_SITE, err, fail, load_site_file
from twin.cli.output import Column, Format, FormatOpt, LimitOpt, emit_rows, resolve_format
from twin.cli.source import DEFAULT_DB, ApiOpt, ReadDbOpt, Source, open_read_store, pick_source

SiteOpt = Annotated[
    Path | None,
    typer.Option(
        "--site",
        help="--db only: the site YAML file (default: the demo site); a service knows its own.",
        show_default=False,
    ),
]

JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print the source's JSON answer as one object.")
]


def _band_style(row: dict[str, Any]) -> str:
    band = row.get("band")
    return BAND_STYLE[Band(band)] if band else ""


_HEADROOM_COLUMNS = [
    Column("kind", "kind"),
    Column("id", "id"),
    Column("rack", "rack"),
    Column("cdu", "CDU"),
    Column("quantity", "quantity"),
    Column("value_now", "now", digits=1),
    Column("limit", "limit", digits=1),
    Column("limit_unit", "limit unit"),
    Column("headroom_now", "headroom", digits=2, style=_band_style),
    Column("unit", "unit"),
    Column("used_pct", "used %", digits=1, style=_band_style),
    Column("band", "band", style=_band_style),
    Column("headroom_min_p50", "min p50", digits=2),
    Column("headroom_min_p90", "min p90", digits=2),
    Column("breach_in_s_p90", "breach p90 [s]", digits=0),
]


def limit_unit(unit: str) -> str:
    """The unit of a limit itself: °C for a temperature (its headroom is in K), else ``unit``."""
    return "°C" if unit in TEMPERATURE_UNITS else unit


_BAND_RANK = {Band.red: 0, Band.amber: 1, Band.neutral: 2, None: 3}


def _worst_first(row: dict[str, Any]) -> tuple:
    """Breached now first, then breaching within the horizon at p90 (soonest first), then by
    band (red, amber, neutral), then by headroom in the limit's own unit (K, A, kW, ...)."""
    h, b90 = row["headroom_now"], row["breach_in_s_p90"]
    breached = h is not None and h <= 0
    return (
        not breached,
        b90 is None,
        b90 if b90 is not None else 0.0,
        _BAND_RANK[Band(row["band"]) if row["band"] else None],
        row["unit"],
        h if h is not None else float("inf"),
        row["kind"],
        row["id"],
    )


def _with_band(row: dict[str, Any]) -> dict[str, Any]:
    b = bands()
    used = b.used_pct(row.get("value_now"), row.get("limit"), row["unit"])
    band = b.band(used)
    return {
        **row,
        "limit_unit": limit_unit(row["unit"]),
        "used_pct": used,
        "band": None if band is None else band.value,
    }


#: The kinds of limit (``twin.analysis.headroom.Kind``, not imported here: `dctwin --help` runs on
#: an install without the service's libraries).
HEADROOM_KINDS = ("gpu", "pdu_phase", "rack", "cdu", "loop", "link")


def headroom(
    api: ApiOpt = None,
    db: ReadDbOpt = None,
    site: SiteOpt = None,
    kind: Annotated[
        str | None,
        typer.Option(
            help=f"Only this kind of limit: {', '.join(HEADROOM_KINDS)}.", show_default=False
        ),
    ] = None,
    rack: Annotated[
        str | None, typer.Option(help="Only the limits of this rack.", show_default=False)
    ] = None,
    cdu: Annotated[
        str | None, typer.Option(help="Only the limits of this CDU.", show_default=False)
    ] = None,
    shard: Annotated[
        str | None,
        typer.Option(
            show_default=False,
            help="--db only: the store is this shard's (`dctwin serve --shard`): model its"
            " sub-site and list only its own components.",
        ),
    ] = None,
    horizon: Annotated[float, typer.Option(help="--db only: seconds ahead.")] = 3600.0,
    step: Annotated[float, typer.Option(help="--db only: seconds between path points.")] = 60.0,
    as_json: JsonOpt = False,
    fmt: FormatOpt = None,
    limit: LimitOpt = None,
) -> None:
    """Headroom of every GPU, PDU phase, rack, CDU, loop and link: now, its share of the limit
    used and its band, its minimum over the horizon, and the time to breach at p90 load.

    With --api (or DCTWIN_API_URL): the service's latest report; with --db: computed now.
    Rows come worst first: breached now, then breaching within the horizon at p90 (soonest
    first), then red, amber and neutral (twin/bands.py: < 70 % of the limit used neutral,
    70-90 % amber, > 90 % red; a temperature counted above 25 °C), then by headroom in the
    limit's own unit. On a terminal the table holds what fits (--limit to change) and says how
    many rows it left out; piped, every row is written as TSV."""
    if kind is not None and kind not in HEADROOM_KINDS:
        raise fail(f"--kind {kind!r}: expected one of {', '.join(HEADROOM_KINDS)}")
    src = pick_source(api, db)
    if src.api is not None:
        if shard is not None:
            raise fail("--shard is for --db: a shard's service lists its own components")
        body = src.get("/api/v1/headroom", {"kind": kind, "rack": rack, "cdu": cdu})
        if body["computed_at"] is None:
            raise fail(f"{src.where()} has no headroom report yet (its first detection pass)")
        title = (
            f"headroom at {_hms(body['data_until'])} UTC (report of {_hms(body['computed_at'])})"
        )
        raw = body["rows"]
    else:
        body, title, raw = _headroom_of_store(src, site, shard, kind, rack, cdu, horizon, step)
    if as_json:
        typer.echo(json.dumps(body, default=str))
        return
    rows = sorted((_with_band(r) for r in raw), key=_worst_first)
    out_fmt = resolve_format(fmt)
    if out_fmt is not Format.table:
        err.print(title, highlight=False)
    emit_rows(rows, _HEADROOM_COLUMNS, out_fmt, limit, title=title, what="limits")
    for p in body.get("problems", []):
        err.print(f"[yellow]{escape(p)}[/]")


def _hms(ts: Any) -> str:
    t = datetime.fromisoformat(ts) if isinstance(ts, str) else ts
    return f"{t:%Y-%m-%d %H:%M:%S}"


def _headroom_of_store(
    src: Source,
    site: Path | None,
    shard: str | None,
    kind: str | None,
    rack: str | None,
    cdu: str | None,
    horizon: float,
    step: float,
) -> tuple[dict[str, Any], str, list[dict[str, Any]]]:
    """(the report as JSON, the title, its rows filtered) computed on the store file."""
    from twin.analysis.headroom import compute_headroom

    site_obj = load_site_file(site or DEMO_SITE, required=True)
    if rack is not None and rack not in {r.name for r in site_obj.racks}:
        raise fail(f"--rack: no rack {rack!r} in site {site_obj.name!r}")
    if cdu is not None and cdu not in site_obj.cdu_by_name:
        raise fail(f"--cdu: no CDU {cdu!r} in site {site_obj.name!r}")
    view = None
    if shard is not None:
        from twin.site.shards import ShardError, shard_view

        try:
            view = shard_view(site_obj, shard)
        except ShardError as e:
            raise fail(f"--shard: {e}") from None
        site_obj = view.site
    with open_read_store(src.db or DEFAULT_DB) as store:
        try:
            report = compute_headroom(store, site_obj, horizon_s=horizon, step_s=step)
        except ValueError as e:
            raise fail(str(e)) from None
    report.rows = [
        r
        for r in report.rows
        if (view is None or view.owns_entity(r.kind, r.id))
        and (kind is None or r.kind == kind)
        and (rack is None or r.rack == rack)
        and (cdu is None or r.cdu == cdu)
    ]
    title = f"headroom at {report.data_until:%Y-%m-%d %H:%M:%S} UTC, load: {report.load_basis}"
    body = report.model_dump(mode="json")
    return body, title, body["rows"]


#: The unit of a hot spot's value, reference and excess, per reason.
_HOTSPOT_UNIT = {"r_drift": "K/W"}

_HOTSPOT_COLUMNS = [
    Column("kind", "kind"),
    Column("id", "id"),
    Column("rack", "rack"),
    Column("reason", "reason"),
    Column("value", "value", digits=2),
    Column("reference", "reference", digits=2),
    Column("excess", "excess", digits=2),
    Column("unit", "unit"),
    Column("sigma_k", "σ [K]", digits=2),
    Column("sigmas", "residual [σ]", digits=1),
    Column("detail", "detail"),
]


def _hotspot_rows(hotspots: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Numeric rows, worst first: temperatures (K) by excess, largest first, then drifts of
    thermal resistance (K/W)."""
    rows = [
        {
            **h,
            "unit": _HOTSPOT_UNIT.get(h["reason"], "K"),
            "sigma_k": h.get("sigma"),
            "sigmas": h.get("residual_sigma"),
        }
        for h in hotspots
    ]
    return sorted(rows, key=lambda r: (r["unit"] != "K", -abs(r["excess"]), r["kind"], r["id"]))


def hotspots(
    api: ApiOpt = None,
    db: ReadDbOpt = None,
    site: SiteOpt = None,
    k_sigma: Annotated[float, typer.Option(help="Residual over the model, in sigma.")] = 3.0,
    minutes: Annotated[int, typer.Option(help="For this many minutes in a row.")] = 5,
    as_json: JsonOpt = False,
    fmt: FormatOpt = None,
    limit: LimitOpt = None,
) -> None:
    """GPUs and racks running hotter than they should (catalog limit, calibrated model,
    thermal-resistance drift, ASHRAE inlet), worst first: the excess over the reference in K
    (in K/W for a drift of thermal resistance), the residual's sigma [K] and how many sigma
    the smallest minute stayed above the model.

    With --api: the service's latest detection pass (computed now when --k-sigma or --minutes
    differ from the defaults); with --db: computed on the store file."""
    src = pick_source(api, db)
    if src.api is not None:
        changed = k_sigma != 3.0 or minutes != 5
        params = {"k_sigma": k_sigma, "minutes": minutes} if changed else {}
        report = src.get("/api/v1/hotspots", params)
    else:
        from twin.analysis.hotspots import find_hotspots

        site_obj = load_site_file(site or DEMO_SITE, required=True)
        with open_read_store(src.db or DEFAULT_DB) as store:
            try:
                found = find_hotspots(store, site_obj, k_sigma=k_sigma, minutes=minutes)
            except ValueError as e:
                raise fail(str(e)) from None
        report = found.model_dump(mode="json")
    if as_json:
        typer.echo(json.dumps(report, default=str))
        return
    out_fmt = resolve_format(fmt)
    if not report["hotspots"]:
        err.print("no hot spots")
    if report["hotspots"] or out_fmt is not Format.table:
        rows = _hotspot_rows(report["hotspots"])
        emit_rows(rows, _HOTSPOT_COLUMNS, out_fmt, limit, title="hot spots", what="hot spots")
    for p in report["problems"]:
        err.print(f"[yellow]{escape(p)}[/]")


_FLEET_COLUMNS = [
    Column("fleet", "fleet"),
    Column("role", "role"),
    Column("state", "state", style=lambda r: "yellow" if r["flagged"] else ""),
    Column("gpus", "GPUs", digits=0),
    Column("gpus_reporting", "reporting", digits=0),
    Column("activity_mean", "activity mean", digits=2),
    Column("activity_p95", "activity p95", digits=2),
    Column("gpus_needed", "GPUs needed", digits=0),
    Column("gpus_to_reclaim", "GPUs to reclaim", digits=0),
    Column("gpu_hours_to_reclaim", "GPU-h to reclaim", digits=0),
    Column("kw_freed", "kW freed", digits=1),
    Column("covered", "covered"),
    Column("reason", "reason"),
]

#: `dctwin fleets`' defaults (``twin.analysis.fleets.DEFAULT_THRESHOLD`` and
#: ``DEFAULT_TARGET_UTIL``, not imported here: `dctwin --help` runs on an install without the
#: service's libraries).
_FLEETS_WINDOW_S, _FLEETS_THRESHOLD, _FLEETS_TARGET = 86400.0, 0.4, 0.7


def fleets(
    api: ApiOpt = None,
    db: ReadDbOpt = None,
    site: SiteOpt = None,
    window: Annotated[
        float, typer.Option(help="Seconds of activity to look at.")
    ] = _FLEETS_WINDOW_S,
    threshold: Annotated[
        float, typer.Option(help="Flag a fleet whose mean activity is under this (0..1).")
    ] = _FLEETS_THRESHOLD,
    target_util: Annotated[
        float,
        typer.Option(help="Utilization of its p95 load the remaining GPUs would run at (0..1)."),
    ] = _FLEETS_TARGET,
    min_coverage: Annotated[
        float | None,
        typer.Option(
            help="--db only: seconds of data needed to judge a fleet (default: 20/24 of the"
            " window).",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOpt = False,
    fmt: FormatOpt = None,
    limit: LimitOpt = None,
) -> None:
    """Underused inference fleets: mean activity under the threshold and GPUs to give back at
    the target utilization of their p95 load (GPUs, GPU-hours and kW), underused fleets first
    (most kW first). A fleet with too little data in the window is "not judged". A fleet's
    `underuse:` block in the site file overrides the threshold, target and coverage.

    With --api: the service's latest detection pass (computed now when an option differs
    from its default); with --db: computed on the store file."""
    src = pick_source(api, db)
    if src.api is not None:
        if min_coverage is not None:
            raise fail("--min-coverage is for --db: the service judges with its own")
        params: dict[str, Any] = {}
        if (window, threshold, target_util) != (
            _FLEETS_WINDOW_S,
            _FLEETS_THRESHOLD,
            _FLEETS_TARGET,
        ):
            params = {"window_s": window, "threshold": threshold, "target_util": target_util}
        payload = src.get("/api/v1/fleets", params)
    else:
        from twin.analysis.fleets import fleets_command_payload

        site_path = site or DEMO_SITE
        load_site_file(site_path, required=True)
        open_read_store(src.db or DEFAULT_DB).close()  # a missing or held file: a clear message
        try:
            payload = fleets_command_payload(
                src.db or DEFAULT_DB,
                site_path,
                window,
                threshold,
                target_util,
                min_coverage_s=min_coverage,
            )
        except ValueError as e:
            raise fail(str(e)) from None
    if as_json:
        typer.echo(json.dumps(payload, default=str))
        return
    rows = [
        dict(f, state="UNDERUSED" if f["flagged"] else "ok" if f["judged"] else "not judged")
        for f in payload["fleets"]
    ]
    rows.sort(key=lambda r: (not r["flagged"], -(r["kw_freed"] or 0.0), r["fleet"]))
    flagged = [r for r in rows if r["flagged"]]
    gpus = sum(r["gpus_to_reclaim"] or 0 for r in flagged)
    kw = sum(r["kw_freed"] or 0.0 for r in flagged)
    title = (
        f"fleets: {len(flagged)} underused of {len(rows)}, {gpus:,} GPUs and {kw:,.1f} kW to"
        " reclaim in the underused ones"
    )
    out_fmt = resolve_format(fmt)
    if out_fmt is not Format.table:
        err.print(title, highlight=False)
    emit_rows(rows, _FLEET_COLUMNS, out_fmt, limit, title=title, what="fleets")


_FORECAST_COLUMNS = [
    Column("entity", "entity"),
    Column("id", "id"),
    Column("model", "model"),
    Column("skill_by_lead", "model and skill by lead"),
    Column("origins_scored", "origins", digits=0),
    Column("interval_basis", "interval from"),
    Column("coverage", "p05-p95 held", digits=2),
    Column("last_kw", "last kW", digits=1),
    Column("p50_end_kw", "p50 at horizon kW", digits=1),
    Column("p90_peak_kw", "p90 peak kW", digits=1),
    Column("p95_peak_kw", "p95 peak kW", digits=1),
    Column("p95_peak_at", "p95 peak at (UTC)"),
    Column("note", "why"),
]

_BACKTEST_COLUMNS = [
    Column("entity", "entity"),
    Column("id", "id"),
    Column("improvement", "vs seasonal-naive", digits=3),
    Column("coverage_p05_p95", "p05-p95 coverage", digits=3),
    Column("skill_by_lead", "skill vs persistence (coverage) by lead"),
]


def _kw(v: float | None) -> float | None:
    return None if v is None else v / 1000.0


def _peak(values: list[float | None], times: list[str]) -> tuple[float | None, str | None]:
    best = None
    for v, t in zip(values, times, strict=True):
        if v is not None and (best is None or v > best[0]):
            best = (v, t)
    return (None, None) if best is None else (best[0], best[1])


def _skill_text(hs: list[dict]) -> str:
    """'15 min persistence 0.00; 1 h level +0.31' from a forecast's per-lead skill."""
    from twin.forecast.forecast import _dur

    parts = []
    for h in hs:
        sk = "-" if h["skill"] is None else f"{h['skill']:+.2f}"
        parts.append(f"{_dur(h['horizon_s'])} {h['model']} {sk}")
    return "; ".join(parts)


def _forecast_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per fleet and rack: the model and its skill by lead, where the interval comes
    from and how often it held, last, p50 at the horizon, the p90 and p95 peaks [kW]."""
    rows = []
    for e in result["entities"]:
        p90, _ = _peak(e["p90_w"], e["t"])
        p95, at = _peak(e["p95_w"], e["t"])
        p50_end = next((v for v in reversed(e["p50_w"]) if v is not None), None)
        rows.append(
            {
                **{k: e[k] for k in ("entity", "id", "model", "origins_scored", "note")},
                "skill_by_lead": _skill_text(e["skill"]),
                "interval_basis": e["interval"]["basis"],
                "coverage": e["interval"]["checked_coverage"],
                "last_kw": _kw(e["last_w"]),
                "p50_end_kw": _kw(p50_end),
                "p90_peak_kw": _kw(p90),
                "p95_peak_kw": _kw(p95),
                "p95_peak_at": None if at is None else _hms(at),
            }
        )
    return rows


def _backtest_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    def lead(h: dict[str, Any]) -> str:
        sk = "-" if h["skill"] is None else f"{h['skill']:+.2f}"
        cov = "-" if h["coverage_p05_p95"] is None else f"{h['coverage_p05_p95']:.2f}"
        return f"{h['horizon_s'] / 60:g} min {sk} (cov {cov})"

    return [
        dict(e, skill_by_lead="; ".join(lead(h) for h in e["horizons"])) for e in result["entities"]
    ]


def _parse_now(now: str | None) -> datetime | None:
    """``--now`` as an aware UTC datetime (a time without an offset is UTC)."""
    if now is None:
        return None
    try:
        t = datetime.fromisoformat(now)
    except ValueError:
        raise fail(f"--now {now!r}: not an ISO-8601 time (2026-12-01T06:00:00Z)") from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def forecast(
    api: ApiOpt = None,
    db: ReadDbOpt = None,
    site: SiteOpt = None,
    horizon: Annotated[float, typer.Option(help="Seconds ahead.")] = 6 * 3600.0,
    step: Annotated[float, typer.Option(help="Seconds per forecast step.")] = 300.0,
    now: Annotated[
        str | None,
        typer.Option(
            help="--db only: forecast (or backtest) from this past time, ISO 8601 (no offset:"
            " UTC), using only the data before it (default: the newest node sample).",
            show_default=False,
        ),
    ] = None,
    backtest: Annotated[
        bool,
        typer.Option(help="--db only: backtest on the store's history instead of forecasting."),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print everything as JSON, the forecast paths included.")
    ] = False,
    fmt: FormatOpt = None,
    limit: LimitOpt = None,
) -> None:
    """Load forecast per fleet and per rack: a row each with the model chosen by its skill
    against persistence (1 - MAE/MAE_persistence on rolling origins of its own history) per
    lead, the origins scored, where the interval comes from and how often it held, the last
    power, the p50 at the horizon and the p90 and p95 peaks [kW] and when; --json every step's
    p05/p50/p90/p95 W. With --backtest, what would have been published, scored."""
    src = pick_source(api, db)
    if src.api is not None:
        if backtest or now is not None:
            raise fail("--backtest and --now read the store's history: give --db PATH (a copy)")
        result = src.get("/api/v1/forecast", {"horizon_s": horizon, "step_s": step})
    else:
        result = _forecast_of_store(src.db or DEFAULT_DB, site, horizon, step, backtest, now)
    if as_json:
        typer.echo(json.dumps(result, default=str))
        return
    if backtest:
        title = (
            f"backtest to {_hm(result['window_end'])} UTC: {len(result['origins'])} origins"
            f" scored of {result['origins_listed']} tried, horizon {result['horizon_s']:g} s"
        )
        rows, cols = _backtest_rows(result), _BACKTEST_COLUMNS
    else:
        title = (
            f"forecast from {_hm(result['now'])} UTC, {result['horizon_s']:g} s ahead;"
            " skill = 1 - MAE/MAE_persistence on the entity's own history"
        )
        rows, cols = _forecast_rows(result), _FORECAST_COLUMNS
    out_fmt = resolve_format(fmt)
    if out_fmt is not Format.table:
        err.print(title, highlight=False)
    emit_rows(rows, cols, out_fmt, limit, title=title, what="entities")


def _hm(ts: Any) -> str:
    t = datetime.fromisoformat(ts) if isinstance(ts, str) else ts
    return f"{t:%Y-%m-%d %H:%M}"


def _forecast_of_store(
    db: Path, site: Path | None, horizon: float, step: float, backtest: bool, now: str | None
) -> dict[str, Any]:
    from twin.forecast import forecast_site, run_backtest
    from twin.store.reads import sample_span

    site_obj = load_site_file(site or DEMO_SITE, required=True)
    at = _parse_now(now)
    with open_read_store(db) as store:
        oldest, newest = sample_span(store, "node")
        if newest is None:
            raise fail(f"--db {db}: no node power samples to forecast from")
        if at is not None and at <= oldest:
            raise fail(
                f"--now {now}: the store's node power starts at {oldest:%Y-%m-%d %H:%M:%S} UTC"
            )
        try:
            run = run_backtest if backtest else forecast_site
            result = run(store, site_obj, now=at or newest, horizon_s=horizon, step_s=step)
        except ValueError as e:
            raise fail(str(e)) from None
    return result.model_dump(mode="json")
