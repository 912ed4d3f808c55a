"""`dctwin import ...`: history other tools recorded, through the same validation and ingest
path as live telemetry, into a store (--db) or over MQTT to a running service (--broker).

An import accepts history of any age: the ingest's max-past guard is off for it (said in its
output). It exits 1 when nothing of the file was stored, with the reasons counted."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from twin.cli.common import (
    MaxFutureOpt,
    SiteOpt,
    broker_config,
    err,
    fail,
    load_site_file,
    open_store,
    setup_logging,
)

import_app = typer.Typer(
    help="Import history other tools recorded (nvidia-smi logs, Prometheus query answers),"
    " through the ingest path.",
    no_args_is_help=True,
)

CHUNK = 20_000

DbOpt = Annotated[Path | None, typer.Option("--db", help="Ingest into this store.")]
BrokerOpt = Annotated[str | None, typer.Option(help="Publish to this broker (host:port) instead.")]
SiteNameOpt = Annotated[
    str | None, typer.Option(help="Site name of the topics (default: the site's, or 'site').")
]

HISTORY_NOTE_DB = "history accepted: the max-past guard is off for this import"
HISTORY_NOTE_MQTT = (
    "published over MQTT: the receiving service's own --max-past guard (30 days unless set)"
    " decides about old samples"
)


def _to_store(db: Path, site_obj, items, max_future: float) -> dict:
    from twin.ingest import Ingester, IngestLimits
    from twin.ingest.ingester import StoreUnavailable

    with open_store(db) as store:
        ingester = Ingester(store, site_obj, IngestLimits(max_future_s=max_future, max_past_s=0))
        chunk: list = []
        try:
            for item in items:
                chunk.append(item)
                if len(chunk) >= CHUNK:
                    ingester.ingest_or_isolate(chunk)
                    chunk = []
            if chunk:
                ingester.ingest_or_isolate(chunk)
            store.rollup()
        except StoreUnavailable as e:  # disk full, a lock: what is committed stays
            raise fail(f"the store {db} failed: {e}") from None
    return ingester.counters.as_dict()


def _to_broker(broker: str, site_name: str, items) -> dict:
    """Check each message against the contract here (what would be dead-lettered is counted,
    not sent), publish the rest at QoS 1 and wait for every PUBACK."""
    from collectors.contract import ContractError, decode
    from collectors.mqtt import AckedPublisher, BrokerError, connect

    cfg = broker_config(broker)
    refused: Counter[str] = Counter()
    try:
        pub = AckedPublisher(connect(cfg, f"dctwin-import-{site_name}-{os.getpid()}"), cfg)
        try:
            for topic, payload in items:
                try:
                    decode(topic, payload, site_name)
                except ContractError as e:
                    refused[e.reason] += 1
                    continue
                pub.publish(topic, payload)
            missing = pub.flush(300.0)
        finally:
            pub.close()
    except BrokerError as e:
        raise fail(str(e)) from None
    return {**pub.stats(), "unacknowledged": missing, "refused_by_contract": dict(refused)}


def _nothing_stored(file: Path, refused: dict[str, dict[str, int]], dead: dict) -> str:
    """``refused`` maps a unit ("rows", "series") to its counts per reason."""
    parts = [
        f"{n} {unit} {reason}"
        for unit, reasons in refused.items()
        for reason, n in sorted(reasons.items())
    ]
    parts += [f"{n} messages {reason}" for reason, n in sorted(dead.items())]
    return f"nothing of {file} was stored: " + (", ".join(parts) or "it holds no data rows")


def _deliver(
    file: Path,
    out: dict[str, object],
    items,
    *,
    db: Path | None,
    broker: str | None,
    site_obj,
    site_name: str,
    max_future: float,
    refused: dict[str, dict[str, int]],
) -> None:
    """Send ``items`` into the store or over MQTT, print ``out`` with what happened as JSON,
    and exit 1 when nothing was stored (naming the reasons)."""
    if db is not None:
        err.print(f"note: {HISTORY_NOTE_DB}", highlight=False)
        out["max_past"] = "off (import)"
        counters = _to_store(db, site_obj, items, max_future)
        out["ingest"] = counters
        stored = counters["stored_messages"] + counters["duplicates"]
        dead = counters["dead_letters"]
    else:
        err.print(f"note: {HISTORY_NOTE_MQTT}", highlight=False)
        out["max_past"] = "the service's"
        stats = _to_broker(broker or "", site_name, items)
        out["mqtt"] = stats
        stored = stats["acknowledged"] - stats["rejected"]
        dead = stats["refused_by_contract"]
    typer.echo(json.dumps(out))
    if stored == 0:
        raise fail(_nothing_stored(file, refused, dead), code=1)


def _check_target(db: Path | None, broker: str | None, file: Path) -> None:
    if (db is None) == (broker is None):
        raise fail("give exactly one of --db (direct) or --broker (over MQTT)")
    if not file.is_file():
        raise fail(f"{file}: no such file")


@import_app.command("nvidia-smi")
def nvidia_smi(
    file: Annotated[Path, typer.Argument(help="nvidia-smi --query-gpu=... --format=csv log.")],
    node: Annotated[str, typer.Option("--node", help="The node the GPUs are on (the source).")],
    db: DbOpt = None,
    broker: BrokerOpt = None,
    site: SiteOpt = None,
    site_name: SiteNameOpt = None,
    query_gpu: Annotated[
        str | None,
        typer.Option(
            "--query-gpu",
            help="The fields the log was written with (needed for a noheader log), e.g."
            " timestamp,index,power.draw,temperature.gpu",
        ),
    ] = None,
    tz: Annotated[
        str, typer.Option("--tz", help="Time zone of the log's timestamps (nvidia-smi's local).")
    ] = "UTC",
    max_future: MaxFutureOpt = 300.0,
) -> None:
    """Import an nvidia-smi CSV log (any field order, with or without header and units, -l or
    -lms timestamps; [N/A] is missing). Sample ids are <node>:<index> (or the UUID)."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    from collectors.contract import topic_for
    from twin.ingest.nvidia_smi import NvidiaSmiError, messages, parse

    setup_logging(False)
    _check_target(db, broker, file)
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise fail(f"--tz {tz!r} is not a time zone (e.g. UTC, Europe/Berlin)") from None
    site_obj = load_site_file(site)
    name = site_name or (site_obj.name if site_obj else "site")
    try:
        topic_for(name, "gpu", node)
    except ValueError as e:  # a node or site name with '/', '+' or '#'
        raise fail(f"--node {node!r} / site {name!r}: {e}") from None
    try:
        with err.status(escape(f"reading {file}")):
            parsed = parse(file, node, query_gpu=query_gpu, tz=tz)
    except NvidiaSmiError as e:
        raise fail(str(e)) from None
    items = messages(parsed, name, node)
    out: dict[str, object] = {"file": str(file), "node": node, "site": name, "timezone": tz}
    out.update(parsed.summary())
    _deliver(
        file,
        out,
        items,
        db=db,
        broker=broker,
        site_obj=site_obj,
        site_name=name,
        max_future=max_future,
        refused={"rows": dict(parsed.refused)},
    )


@import_app.command("prometheus")
def prometheus(
    file: Annotated[
        Path,
        typer.Argument(
            help="Prometheus API answers (query_range or query JSON; one, an array, or one per"
            " line) holding dcgm-exporter series."
        ),
    ],
    node: Annotated[
        str | None,
        typer.Option(
            "--node",
            help="The node of every series (default: its Hostname label, else its instance's"
            " host).",
        ),
    ] = None,
    db: DbOpt = None,
    broker: BrokerOpt = None,
    site: SiteOpt = None,
    site_name: SiteNameOpt = None,
    max_future: MaxFutureOpt = 300.0,
) -> None:
    """Import dcgm-exporter series from Prometheus HTTP API answers (resultType matrix or
    vector), mapped as the DCGM collector maps them; unknown metrics are counted, NaN/Inf,
    DCGM blanks and unmeasured 0 °C are left out. One message per node and timestamp; sample
    ids are <node>:<gpu> (or the UUID)."""
    from collectors import dcgm
    from collectors.contract import topic_for
    from twin.ingest.prometheus import DcgmTable, PrometheusError, messages, parse

    setup_logging(False)
    _check_target(db, broker, file)
    site_obj = load_site_file(site)
    name = site_name or (site_obj.name if site_obj else "site")
    try:
        topic_for(name, "gpu", node or "node")
    except ValueError as e:  # a node or site name with '/', '+' or '#'
        raise fail(f"--node {node!r} / site {name!r}: {e}") from None
    try:
        table = DcgmTable(
            dcgm.DCGM_FIELDS,
            dcgm.DCGM_FP64_BLANK,
            float(dcgm.DCGM_INT64_BLANK),
            dcgm.DCGM_INT32_BLANK,
        )  # the collector's own table: one mapping of DCGM fields
        with err.status(escape(f"reading {file}")):
            parsed = parse(file, table, node=node, site=name)
    except PrometheusError as e:
        raise fail(str(e)) from None
    for text in parsed.errors[:5]:
        err.print(escape(f"note: refused {text}"), highlight=False)
    if len(parsed.errors) > 5:
        err.print(f"note: refused {len(parsed.errors) - 5} more error answers", highlight=False)
    out: dict[str, object] = {"file": str(file), "node": node, "site": name}
    out.update(parsed.summary())
    _deliver(
        file,
        out,
        messages(parsed, name),
        db=db,
        broker=broker,
        site_obj=site_obj,
        site_name=name,
        max_future=max_future,
        refused=parsed.refused(),
    )
