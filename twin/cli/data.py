"""The store's commands: `dctwin ingest`, `export`, `status`, `maintain` and `calibrate`."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from twin.cli.common import (
    DEMO_SITE,
    DbOpt,
    MaxFutureOpt,
    MaxPastOpt,
    SiteOpt,
    err,
    fail,
    load_site_file,
    open_store,
    parse_time,
    setup_logging,
)
from twin.cli.output import Column, Format, FormatOpt, emit_rows, resolve_format
from twin.cli.source import DEFAULT_DB, ApiOpt, ReadDbOpt, open_read_store, pick_source


def ingest(
    file: Annotated[
        Path, typer.Option("--file", help="JSONL of {topic, payload} lines, or an export dir.")
    ],
    db: DbOpt = Path("dctwin.duckdb"),
    site: SiteOpt = None,
    site_name: Annotated[
        str | None, typer.Option(help="Site name for bundle topics (default: the site's).")
    ] = None,
    max_future: MaxFutureOpt = 300.0,
    max_past: MaxPastOpt = 30 * 86400.0,
) -> None:
    """Load telemetry from a file without a broker, through the same validation as live data."""
    from twin.ingest import Ingester, IngestLimits
    from twin.ingest.files import ingest_path
    from twin.ingest.ingester import StoreUnavailable

    setup_logging(False)
    site_obj = load_site_file(site)
    if not file.exists():
        raise fail(f"--file {file}: no such file or directory")
    name = site_name or (site_obj.name if site_obj else "site")
    with open_store(db) as store:
        ingester = Ingester(store, site_obj, IngestLimits(max_future, max_past))
        with Progress(
            TextColumn("[bold]ingest[/] {task.description}"),
            TextColumn("{task.completed} messages"),
            TimeElapsedColumn(),
            console=err,
            disable=not sys.stderr.isatty(),
        ) as progress:
            task = progress.add_task(str(file))
            try:
                ingest_path(ingester, file, name, lambda n: progress.advance(task, n))
                store.rollup()
            except StoreUnavailable as e:  # disk full, a lock: what is committed stays
                raise fail(f"the store {db} failed: {e}") from None
    counters = ingester.counters.as_dict()
    typer.echo(json.dumps(counters))
    if counters["stored_messages"] == 0 and counters["duplicates"] == 0:
        raise fail(_nothing_stored(file, counters), code=1)


def _nothing_stored(file: Path, counters: dict) -> str:
    """Why nothing of ``file`` was stored, the dead letters counted per reason; a hint when the
    file looks like an nvidia-smi CSV log."""
    dead = counters["dead_letters"]
    parts = [f"{n} {reason}" for reason, n in sorted(dead.items())]
    if counters["dead_letter_repeats"]:
        parts.append(f"{counters['dead_letter_repeats']} dead letters already stored")
    why = ", ".join(parts) if parts else "it holds no messages"
    message = f"nothing of {file} was stored ({why})"
    if file.is_file():
        with file.open("rb") as f:
            head = f.readline(4096).decode("utf-8", "replace")
        if "timestamp" in head and ("[W]" in head or "utilization.gpu" in head or "power." in head):
            message += (
                f"; it looks like an nvidia-smi log: dctwin import nvidia-smi {file} --node NAME"
            )
    return message


def export(
    db: DbOpt = Path("dctwin.duckdb"),
    out: Annotated[Path, typer.Option("--out", help="Output directory.")] = Path("export"),
    to: Annotated[
        str | None,
        typer.Option(
            "--to",
            help="History mode: export every closed hour not yet exported, as"
            " kind=/day=/hour=/shard=/part-0.parquet, to this directory or URL (s3://...)."
            " Idempotent; ignores --out, --start and --end.",
        ),
    ] = None,
    shard: Annotated[
        str, typer.Option("--shard", help="Shard name in the history tree (with --to).")
    ] = "main",
    grace_s: Annotated[
        float,
        typer.Option("--grace-s", min=0, help="An hour is closed this long after its end (--to)."),
    ] = 300.0,
    start: Annotated[str | None, typer.Option(help="ISO 8601 start (default: oldest).")] = None,
    end: Annotated[str | None, typer.Option(help="ISO 8601 end, exclusive (default: newest).")] = (
        None
    ),
) -> None:
    """Export raw samples of a time range to Parquet, partitioned by kind and day; with --to,
    the closed hours of the history tree (docs/history.md)."""
    if to is not None:
        _export_history(db, to, shard, grace_s)
        return
    with open_store(db, read_only=True) as store:
        status = store.status()
        if status["time_range"] is None:
            raise fail(f"{db} holds no samples")
        t0 = (
            parse_time(start, "--start") if start else parse_time(status["time_range"]["start"], "")
        )
        t1 = (
            parse_time(end, "--end")
            if end
            else parse_time(status["time_range"]["end"], "") + timedelta(microseconds=1)
        )
        if t1 <= t0:
            raise fail(f"--end {t1.isoformat()} is not after --start {t0.isoformat()}")
        exported = store.export_parquet(out, t0, t1)
    typer.echo(
        json.dumps(
            {"out": str(out), "start": t0.isoformat(), "end": t1.isoformat(), "samples": exported}
        )
    )


def _export_history(db: Path, to: str, shard: str, grace_s: float) -> None:
    from twin.store.history import HistoryError, export_closed_hours

    if not db.exists():
        raise fail(f"--db {db}: no such store")
    with open_store(db) as store:
        try:
            r = export_closed_hours(store.con, to, shard=shard, grace_s=grace_s)
        except HistoryError as e:
            raise fail(str(e)) from None
    typer.echo(
        json.dumps(
            {
                "to": to,
                "shard": shard,
                "hours": r.hours,
                "rows": r.rows,
                "bytes": r.bytes,
                "skipped": r.skipped,
            }
        )
    )


def status(
    api: ApiOpt = None,
    db: ReadDbOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    fmt: FormatOpt = None,
) -> None:
    """What the store holds: samples per kind, time range, dead letters, unknown ids.

    Read from a running service (--api URL, DCTWIN_API_URL) or a store file (--db). On a
    terminal: tables; piped (or --format tsv/csv): one row per figure, columns section, key,
    count (messages, sources, samples and readings per kind, dead letters per reason, unknown
    ids with their samples), the time range on stderr."""
    src = pick_source(api, db)
    if src.api is not None:
        st = src.get("/api/v1/status", {"limit": STATUS_UNKNOWN_IDS_MAX})
    else:
        with open_read_store(src.db or DEFAULT_DB) as store:
            st = store.status()
    if as_json:
        typer.echo(json.dumps(st, default=str))
        return
    out_fmt = resolve_format(fmt)
    if out_fmt is Format.table:
        _status_tables(st)
        return
    if st["time_range"]:
        err.print(
            f"{st['db']}: {st['time_range']['start']} .. {st['time_range']['end']} (UTC)",
            highlight=False,
        )
    cols = [Column("section", "section"), Column("key", "key"), Column("count", "count", digits=0)]
    emit_rows(_status_rows(st), cols, out_fmt, 0)


#: Most unknown ids the API lists (twin.api.routes.service.STATUS_UNKNOWN_IDS_MAX).
STATUS_UNKNOWN_IDS_MAX = 10_000


def _status_rows(st: dict) -> list[dict]:
    """The status as (section, key, count) rows, every count a number."""
    rows = [
        {"section": "messages", "key": "", "count": st["messages"]},
        {"section": "sources", "key": "", "count": st["sources"]},
    ]
    rows += [{"section": "samples", "key": k, "count": n} for k, n in st["samples"].items()]
    rows += [{"section": "readings", "key": k, "count": n} for k, n in st["readings"].items()]
    rows += [
        {"section": "dead_letters", "key": reason, "count": n}
        for reason, n in sorted(st["dead_letters"].items(), key=lambda kv: -kv[1])
    ]
    rows += [
        {
            "section": "unknown_ids",
            "key": f"{u['kind']} {u['id']} {u['source']}",
            "count": u["samples"],
        }
        for u in st["unknown_ids"]
    ]
    return rows


def _status_tables(st: dict) -> None:
    out = Console()
    shard = f" (shard {st['shard']})" if st.get("shard") else ""
    out.print(
        f"[bold]{st['db']}[/]{shard}  {st['messages']:,} messages from {st['sources']:,} sources"
    )
    if st["time_range"]:
        out.print(f"time range: {st['time_range']['start']} .. {st['time_range']['end']} (UTC)")
    kinds = Table(title="samples per kind", title_justify="left", highlight=False)
    for col in ("kind", "samples", "readings"):
        kinds.add_column(col, justify="left" if col == "kind" else "right")
    for kind, n in st["samples"].items():
        kinds.add_row(kind, f"{n:,}", f"{st['readings'][kind]:,}")
    out.print(kinds)
    if st["dead_letters"]:
        dead = Table(title="dead letters", title_justify="left", highlight=False)
        dead.add_column("reason")
        dead.add_column("messages", justify="right")
        for reason, n in sorted(st["dead_letters"].items(), key=lambda kv: -kv[1]):
            dead.add_row(reason, f"{n:,}")
        out.print(dead)
    else:
        out.print("dead letters: none")
    total = st.get("unknown_ids_total", len(st["unknown_ids"]))
    if not total:
        out.print("unknown ids: none")
        return
    unknown = Table(
        title=f"unknown ids: {total:,} (most recently seen first)",
        title_justify="left",
        highlight=False,
    )
    for col in ("kind", "id", "source", "samples"):
        unknown.add_column(col, justify="right" if col == "samples" else "left")
    for u in st["unknown_ids"][:20]:
        unknown.add_row(u["kind"], u["id"], u["source"], f"{u['samples']:,}")
    out.print(unknown)
    if total > 20:
        out.print(f"... and {total - 20:,} more (--json lists {len(st['unknown_ids']):,})")


def maintain(
    db: DbOpt = Path("dctwin.duckdb"),
    retention_days: Annotated[
        float | None, typer.Option(help="Delete raw samples older than this many days.")
    ] = None,
) -> None:
    """Bring the 1-minute and 1-hour rollups up to date and apply raw retention."""
    with open_store(db) as store:
        result = {"rollup_rows": store.rollup()}
        if retention_days:
            result["deleted"] = store.apply_retention(retention_days)
    typer.echo(json.dumps(result))


def calibrate(
    db: DbOpt = Path("dctwin.duckdb"),
    site: SiteOpt = None,
    window: Annotated[float, typer.Option(help="Seconds of telemetry to fit on.")] = 7200.0,
    holdout: Annotated[
        float, typer.Option(help="Last seconds of the window held out to score the fit.")
    ] = 1200.0,
    end: Annotated[str | None, typer.Option(help="ISO 8601 end (default: newest sample).")] = None,
    step: Annotated[
        float | None,
        typer.Option(
            help="Grid step in seconds for every device (default: the data's own, per group of"
            " GPUs reporting at one rate: the median interval of their timestamps, coarsest"
            " of theirs and their CDU, PDU and node telemetry's)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Fit every device against the store and save the parameters as a new version.

    Telemetry sampled at any step from 0.1 s to 60 s is fitted on its own grid; the least data
    each fit needs is a span of time (5 minutes for a GPU's RC model), not a sample count."""
    from twin.calibrate.calibrate import calibrate as run_calibration
    from twin.calibrate.calibrate import save_run

    site_obj = load_site_file(site or DEMO_SITE, required=True)
    if step is not None and not 0 < step <= window:
        raise fail(f"--step {step:g} must be > 0 and at most --window {window:g}")
    if holdout >= window:
        raise fail(f"--holdout {holdout:g} must be shorter than --window {window:g}")
    n_gpus = sum(len(n.gpu_ids()) for n in site_obj.nodes)
    with (
        open_store(db) as store,
        err.status(f"calibrating {n_gpus:,} GPUs of {site_obj.name} on {window:g} s of data"),
    ):
        try:
            result = run_calibration(
                store,
                site_obj,
                end=parse_time(end, "--end") if end else None,
                window_s=window,
                holdout_s=holdout,
                step_s=step,
            )
        except ValueError as e:
            raise fail(str(e)) from None
        save_run(store, result)
    if as_json:
        typer.echo(json.dumps(result))
        return
    out = Console()
    run = result["run"]
    out.print(
        f"calibration run {run['run_id']}: {run['window_start']} .. {run['window_end']}"
        f" ({run['gpus']} GPUs, {run['seconds']} s)"
    )
    for cls, d in sorted(result["classes"].items()):
        out.print(f"[bold]{cls}[/] usable {d['usable_fraction']:.0%}")
        for name, v in sorted(d.items()):
            if isinstance(v, dict) and "median" in v:
                out.print(
                    f"  {name:22} median {v['median']:.4g}  p10 {v['p10']:.4g}"
                    f"  p90 {v['p90']:.4g}  n={v['n']}"
                )
        for quantity, q in sorted(d.get("quality", {}).items()):
            out.print(
                f"  quality {quantity:18} MAE {q['mae']}  CV(RMSE) {q['cv_rmse']}  NMBE {q['nmbe']}"
            )
    _print_refusals(out, result["params"])
    for e in result["events"]:
        out.print(f"[yellow]event[/] {escape(str(e['id']))}: {escape(str(e['detail']))}")


def _print_refusals(out: Console, rows: list[dict], per_kind: int = 8) -> None:
    """Why fits were refused, per device kind: each reason once, with how many devices it
    holds for and the first few of them (a refused fit publishes reasons, not error
    figures)."""
    by_kind: dict[str, dict[str, list[str]]] = {}
    for r in rows:
        if r["usable"] or not r.get("reason"):
            continue
        ids = by_kind.setdefault(r["kind"], {}).setdefault(r["reason"], [])
        if r["id"] not in ids:
            ids.append(r["id"])
    for kind, reasons in sorted(by_kind.items()):
        n = len({i for ids in reasons.values() for i in ids})
        out.print(f"[bold]{kind}[/] refused fits: {n} device(s)", highlight=False)
        ranked = sorted(reasons.items(), key=lambda kv: -len(kv[1]))
        for reason, ids in ranked[:per_kind]:
            shown = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
            out.print(f"  {shown}: {reason}", highlight=False, markup=False, soft_wrap=True)
        if len(ranked) > per_kind:
            out.print(f"  ... and {len(ranked) - per_kind} other reasons (--json lists them)")
