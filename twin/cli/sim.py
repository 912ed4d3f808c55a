"""`dctwin sim`: the site simulator publishing over MQTT (or to a JSONL file)."""

from __future__ import annotations

import json
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from collectors.mqtt import BrokerError
from twin.cli.common import (
    DEMO_SITE,
    BrokerOpt,
    SiteOpt,
    broker_config,
    err,
    fail,
    load_site_file,
    parse_time,
    setup_logging,
)
from twin.procs import on_stop_signals


def sim(
    site: SiteOpt = None,
    broker: BrokerOpt = None,
    seed: Annotated[int, typer.Option(help="Random seed; same seed, same telemetry.")] = 0,
    rate: Annotated[
        float, typer.Option(help="Samples per simulated second per device [Hz].")
    ] = 1.0,
    speed: Annotated[
        float, typer.Option(help="Simulated seconds per wall second; 0 = as fast as possible.")
    ] = 1.0,
    duration: Annotated[
        float | None,
        typer.Option(help="Simulated seconds to run (default: until Ctrl-C or SIGTERM)."),
    ] = None,
    start: Annotated[
        str | None,
        typer.Option(
            help="Simulated start time, ISO 8601 UTC. Default: now; with --speed other than 1"
            " and a --duration, now minus the duration, so no timestamp lies in the future."
        ),
    ] = None,
    fault: Annotated[
        list[str] | None,
        typer.Option(
            help="Inject a fault, KIND:TARGET@START[+DURATION]; kinds: cold_plate,"
            " cold_plate_decay and phase_creep (these two ramp up over DURATION), pump_failure,"
            " phase_overload, fleet_idle. Repeatable."
            " E.g. pump_failure:cdu-1/pump1@10m+15m."
        ),
    ] = None,
    truth: Annotated[
        Path | None, typer.Option(help="Write the true device parameters to this JSON file.")
    ] = None,
    jsonl: Annotated[
        Path | None, typer.Option(help="Also write every message to this JSONL file.")
    ] = None,
    no_mqtt: Annotated[
        bool, typer.Option("--no-mqtt", help="Do not publish (use --jsonl).")
    ] = False,
    verbose: bool = False,
) -> None:
    """Simulate a whole site (GPUs, nodes, PDUs, CDUs, links) and publish it over MQTT."""
    from twin.simulator import SiteSimulator, parse_fault
    from twin.simulator.publisher import run_simulation

    setup_logging(verbose)
    site_obj = load_site_file(site or DEMO_SITE, required=True)
    try:
        faults = [parse_fault(f) for f in fault or []]
    except ValueError as e:
        raise fail(str(e)) from None
    if start:
        t_start = parse_time(start, "--start")
    else:
        now = datetime.now(UTC).replace(microsecond=0)
        t_start = now - timedelta(seconds=duration) if duration and speed != 1 else now
    try:
        simulator = SiteSimulator(site_obj, seed=seed, start=t_start, rate_hz=rate, faults=faults)
    except ValueError as e:
        raise fail(str(e)) from None
    cfg = None if no_mqtt else broker_config(broker)
    if cfg is None and jsonl is None:
        raise fail("--no-mqtt needs --jsonl PATH, or there is nowhere to send the telemetry")
    if truth:
        try:
            truth.write_text(json.dumps(simulator.truth(), indent=1, default=str))
        except OSError as e:
            raise fail(f"--truth {truth}: cannot write: {e.strerror or e}") from None
    stop = threading.Event()
    on_stop_signals(stop)
    total = int(duration * rate) if duration else None
    with Progress(
        TextColumn("[bold]sim[/] {task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} ticks"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
        disable=not sys.stderr.isatty(),
    ) as progress:
        task = progress.add_task(site_obj.name, total=total)
        try:
            stats = run_simulation(
                simulator,
                broker=cfg,
                jsonl=jsonl,
                speed=speed,
                duration_s=duration,
                stop=stop,
                on_tick=lambda n: progress.update(task, completed=n),
            )
        except BrokerError as e:
            raise fail(str(e)) from None
        except OSError as e:
            what = f"--jsonl {jsonl}: cannot write" if jsonl else "simulator"
            raise fail(f"{what}: {e.strerror or e}") from None
    typer.echo(json.dumps(stats))
