"""The twin service as one object: what `dctwin serve` runs, and what tests and benchmarks build.

:class:`Service` composes, over one DuckDB store (DuckDB allows one writer process):

- the ingest: an :class:`~twin.ingest.Ingester` and, with a broker, the MQTT receiver
  (:class:`~twin.ingest.mqtt_service.MqttIngestService`, which also brings the rollups up to
  date and applies raw retention on its schedule);
- the background loops: calibration (:class:`~twin.calibrate.schedule.CalibrationScheduler`),
  detection (headroom, hot spots, fleets, :class:`~twin.analysis.detect.DetectionScheduler`) with
  the alert engine over ``rules`` and the outbox's delivery workers over ``hooks``;
- the HTTP API (:class:`~twin.api.ApiServer`) with the what-if jobs, which use the service's
  own rule file;
- one :class:`~twin.health.ServiceHealth` that every part reports into.

Building a Service opens the store and wires the parts without starting a thread, so a test or
a benchmark can feed ``service.ingester`` or run ``service.detector.run_once()`` first.
:meth:`Service.start` starts the parts, :meth:`Service.stop` stops them in order (the API
first, then the loops, then the ingest, which writes what it holds; the store last), and the
object is a context manager doing both::

    with Service(ServiceConfig(db=Path("dctwin.duckdb"), site=site, broker=cfg)) as svc:
        print(svc.url)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from twin.health import ServiceHealth
from twin.ingest import Ingester, IngestLimits
from twin.ingest.mqtt_service import ServiceOptions
from twin.site.shards import DEFAULT_SHARD
from twin.store import Store, StoreError
from twin.store.reads import meta_value, set_meta_value

if TYPE_CHECKING:
    from collectors.mqtt import BrokerConfig
    from twin.alerts import AlertEngine, Delivery
    from twin.alerts.reload import AlertReloader
    from twin.analysis.detect import DetectionScheduler
    from twin.api import ApiContext, ApiServer
    from twin.calibrate.schedule import CalibrationScheduler
    from twin.ingest.mqtt_service import MqttIngestService
    from twin.site import Site
    from twin.site.shards import ShardView

__all__ = ["Service", "ServiceConfig", "ServiceError", "claim_store"]

log = logging.getLogger(__name__)


class ServiceError(RuntimeError):
    """The service could not be built or started; the message says which part and why."""


@dataclass(frozen=True)
class ServiceConfig:
    """What `dctwin serve`'s options say (see its --help for each).

    ``broker`` None: no MQTT ingest (feed :attr:`Service.ingester` directly). ``site`` None:
    ingest only, no calibration, detection or alerts. ``rules`` None: no alert engine, and
    the API's what-if jobs list no alerts. ``whatif_bundles`` None: no what-if routes.
    ``whatif_reports`` None: ``<db>.whatif`` beside the store. ``seed_calibration``: a
    bundle of the same site whose calibration a store without one starts from
    (:mod:`twin.calibrate.seed`; needs ``site``).
    """

    db: Path
    site: Site | None = None
    broker: BrokerConfig | None = None
    ingest: ServiceOptions = field(default_factory=ServiceOptions)
    max_future_s: float = 300.0
    max_past_s: float = 30 * 86400.0
    stall_after_s: float = 60.0
    calibrate_every_s: float = 3600.0
    calibrate_window_s: float = 7200.0
    calibrate_holdout_s: float = 1200.0
    detect_every_s: float = 60.0
    #: the breached-now pass's cadence (twin.analysis.detect.now_observations): limits crossed in
    #: the newest sample page within seconds; 0: only the full pass judges them
    fast_every_s: float = 10.0
    rules: Path | None = None
    hooks: Path | None = None
    #: the console's base URL: every page links the component's console page (None: no link)
    console_url: str | None = None
    api: bool = True
    api_host: str = "127.0.0.1"
    api_port: int = 8420
    api_allowed_hosts: tuple[str, ...] = ()
    api_token: str | None = None
    whatif_bundles: Path | None = None
    whatif_scenarios: Path | None = None
    whatif_reports: Path | None = None
    seed_calibration: Path | None = None
    #: The shard of ``site`` this service is (twin.site.shards): it subscribes to the shard's
    #: topic filters only, stores only its sources and those it reads, and calibrates, forecasts
    #: and detects over the shard's sub-site. None: the whole site (shard "main").
    shard: str | None = None
    #: DuckDB's memory limit for this service's store [MB] (None: DuckDB's default, 80 % of RAM)
    store_memory_mb: int | None = None
    #: DuckDB's worker threads (None: one per core)
    store_threads: int | None = None
    #: how much lower the calibration and detection threads run than ingest and the API (the
    #: nice value added to theirs, Linux); 0: the same
    background_nice: int = 10


def claim_store(store: Store, shard: str, db: Path) -> None:
    """Record ``shard`` in the store's meta, or raise ServiceError when another shard wrote it
    (a shard's store holds only that shard's sources: another shard must not append to it)."""
    claimed = meta_value(store, "shard")
    if claimed is not None and claimed != shard:
        raise ServiceError(
            f"{db} is the store of shard {claimed!r}, not of shard {shard!r}: give each"
            " shard its own --db"
        )
    if claimed is None:
        set_meta_value(store, "shard", shard)


class Service:
    """The twin service over ``config`` (see the module docstring)."""

    def __init__(self, config: ServiceConfig):
        if config.calibrate_holdout_s >= config.calibrate_window_s:
            raise ServiceError("--calibrate-holdout must be shorter than --calibrate-window")
        self.shard: ShardView | None = self._shard_view(config)
        if self.shard is not None:
            topics = tuple(self.shard.topic_filters)
            config = dataclasses.replace(
                config, ingest=dataclasses.replace(config.ingest, topics=topics)
            )
        self.config = config
        #: what calibration, forecast, detection and the API model: the shard's sub-site
        self.site = self.shard.site if self.shard is not None else config.site
        self.health = ServiceHealth(stall_after_s=config.stall_after_s)
        try:
            self.store = Store(
                config.db, memory_limit_mb=config.store_memory_mb, threads=config.store_threads
            )
        except StoreError as e:
            raise ServiceError(str(e)) from None
        try:
            claim_store(self.store, config.shard or DEFAULT_SHARD, config.db)
        except BaseException:
            self.store.close()
            raise
        self.ingester = Ingester(
            self.store,
            config.site,  # every id of the site is known; the shard's own are its to store
            IngestLimits(config.max_future_s, config.max_past_s),
            accept=self.shard.accepted if self.shard is not None else None,
        )
        self.mqtt: MqttIngestService | None = None
        self.calibrator: CalibrationScheduler | None = None
        self.detector: DetectionScheduler | None = None
        self.engine: AlertEngine | None = None
        self.delivery: Delivery | None = None
        self.ctx: ApiContext | None = None
        self.api_server: ApiServer | None = None
        self._reloader: AlertReloader | None = None
        self._started: list[Any] = []
        self._stopped = False
        #: the run seeded from ``config.seed_calibration`` (None: none was, or it had one)
        self.seeded = None
        try:
            self._seed()
            self._build()
        except BaseException:
            self.store.close()
            raise

    @staticmethod
    def _shard_view(config: ServiceConfig) -> ShardView | None:
        if config.shard is None:
            return None
        if config.site is None:
            raise ServiceError("--shard needs --site (the shards are named in the site file)")
        from twin.site.shards import ShardError, shard_view

        try:
            return shard_view(config.site, config.shard)
        except ShardError as e:
            raise ServiceError(f"--shard: {e}") from None

    # ---- building --------------------------------------------------------------------------

    def _seed(self) -> None:
        """Seed a store without a calibration from ``config.seed_calibration``."""
        path = self.config.seed_calibration
        if path is None:
            return
        if self.site is None:
            raise ServiceError("--seed-calibration needs --site (the bundle's site is checked)")
        from twin.calibrate.seed import SeedError, seed_from_bundle

        try:
            self.seeded = seed_from_bundle(self.store, self.site, path)
        except SeedError as e:
            raise ServiceError(f"--seed-calibration {e}") from None
        if self.seeded is not None:
            log.info(
                "calibration run %d seeded from %s (%d parameters, fitted %s) until the first"
                " fit on live data",
                self.seeded.run_id,
                path,
                self.seeded.params,
                self.seeded.fitted_at.isoformat(),
            )

    def _build(self) -> None:
        cfg, site = self.config, self.site
        if cfg.broker is not None:
            from twin.ingest.mqtt_service import MqttIngestService

            self.mqtt = MqttIngestService(cfg.broker, self.ingester, cfg.ingest, health=self.health)
        if site is not None and cfg.calibrate_every_s > 0:
            from twin.calibrate.schedule import CalibrationScheduler

            self.calibrator = CalibrationScheduler(
                self.store,
                site,
                interval_s=cfg.calibrate_every_s,
                window_s=cfg.calibrate_window_s,
                holdout_s=cfg.calibrate_holdout_s,
                health=self.health,
                nice=cfg.background_nice,
            )
        if site is not None and cfg.detect_every_s > 0:
            from twin.analysis.detect import DetectionScheduler

            if cfg.rules is not None:
                self._build_alerting(site, cfg.rules, cfg.hooks)
            self.detector = DetectionScheduler(
                self.store,
                site,
                interval_s=cfg.detect_every_s,
                fast_every_s=cfg.fast_every_s,
                engine=self.engine,
                health=self.health,
                owns=self.shard.owns_entity if self.shard is not None else None,
                nice=cfg.background_nice,
            )
        if cfg.api:
            self._build_api()

    def _build_alerting(self, site: Site, rules: Path, hooks: Path | None) -> None:
        """The alert engine on the store, and the delivery workers of its outbox (one per
        hook, reporting into health as ``outbox:<hook>``; started by :meth:`start`)."""
        from twin.alerts import AlertEngine, Delivery, Outbox, RuleFileError, Topology, load_rules
        from twin.alerts.hooks import HookSetup, Router, load_hook_setup

        try:
            rule_set = load_rules(rules)
            setup = load_hook_setup(hooks) if hooks is not None else HookSetup([], Router())
            hook_list = setup.hooks
        except RuleFileError as e:
            raise ServiceError(str(e)) from None
        if not hook_list:
            log.warning(
                "no --hooks: alerts are kept in the store (alert_history, GET /api/v1/alerts),"
                " not sent"
            )
        outbox = Outbox(self.store.cursor(), hook_list, router=setup.router)
        self.engine = AlertEngine(
            rule_set, Topology.from_site(site), outbox, console_url=self.config.console_url
        )
        self.delivery = Delivery(outbox, interval_s=1.0, health=self.health)
        from twin.alerts.reload import AlertReloader

        self._reloader = AlertReloader(self.engine, self.delivery, rules, hooks)
        for h in hook_list:
            logging.getLogger("twin.alerts").info("hook %s: %s", h.name, h.target)

    def _build_api(self) -> None:
        from twin.api import ApiContext
        from twin.api.whatif import WhatifSettings

        cfg = self.config
        self.ctx = ApiContext(
            self.store,
            site=self.shard.own_site if self.shard is not None else self.site,
            ingester=self.ingester,
            detector=self.detector,
            calibrator=self.calibrator,
            engine=self.engine,
            service=self.mqtt,
            token=cfg.api_token or None,
            health=self.health,
            allowed_hosts=[h for h in cfg.api_allowed_hosts if h.strip()],
        )
        if cfg.whatif_bundles is not None:
            scenarios = cfg.whatif_scenarios or cfg.whatif_bundles / "scenarios"
            reports = cfg.whatif_reports or cfg.db.with_name(cfg.db.name + ".whatif")
            self.ctx.whatif = WhatifSettings(
                cfg.whatif_bundles, scenarios, reports, rules=cfg.rules
            )

    # ---- running ---------------------------------------------------------------------------

    @property
    def url(self) -> str | None:
        """The API's base URL once started (None without the API)."""
        return self.api_server.url if self.api_server is not None else None

    def start(self) -> Service:
        """Start the ingest, the loops and the API; on a failure, stop what started, close
        the store and raise :class:`ServiceError` naming the part."""
        from collectors.mqtt import BrokerError
        from twin.api import ApiError, ApiServer

        try:
            if self.mqtt is not None:
                self.mqtt.start()
                self._started.append(self.mqtt)
            for part in (self.calibrator, self.delivery, self.detector):
                if part is not None:
                    part.start()
                    self._started.append(part)
            if self.ctx is not None:
                server = ApiServer(self.ctx, host=self.config.api_host, port=self.config.api_port)
                self.api_server = server.start()
                self._started.append(server)
        except (BrokerError, ApiError) as e:
            self.stop()
            raise ServiceError(str(e)) from None
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> list[str]:
        """Stop the API first (no new requests), then the loops, then the ingest (it writes
        what it holds), and close the store last. One part failing to stop does not keep
        the others running: what failed is logged and returned, one line each. Idempotent."""
        if self._stopped:
            return []
        self._stopped = True
        order = [self.api_server, self.calibrator, self.detector, self.delivery, self.mqtt]
        problems: list[str] = []
        for part in order:
            if part is None:
                continue
            try:
                if part in self._started:
                    part.stop()
                else:
                    self._close_unstarted(part)
            except Exception as e:  # say what failed, stop the rest
                problems.append(f"stopping {type(part).__name__}: {e}")
                log.warning("%s", problems[-1])
        if self.ctx is not None and self.api_server is None:
            self.ctx.close()  # the server closes it when it ran
        self.store.close()
        return problems

    @staticmethod
    def _close_unstarted(part: Any) -> None:
        """A loop that never started holds only its cursor on the store."""
        cursor = getattr(part, "store", None)
        if isinstance(cursor, Store):
            with contextlib.suppress(Exception):
                cursor.close()

    def on_sighup(self, signum: int, frame: FrameType | None) -> None:
        """The SIGHUP handler: reload the rule and hook files (:mod:`twin.alerts.reload`), or
        say that there is nothing to reload."""
        if self._reloader is None:
            logging.getLogger("twin.alerts.reload").warning(
                "SIGHUP: no alert rules to reload (serve runs alerting with --rules, --site"
                " and --detect-every > 0)"
            )
            return
        self._reloader.on_signal(signum, frame)

    def __enter__(self) -> Service:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
