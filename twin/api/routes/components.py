"""The twin's components now: /api/v1/headroom, /overview, /racks, /racks/{name}, /power,
/cooling and /network."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query

from collectors.contract import sub_id
from twin.api import models as m
from twin.api import queries
from twin.api.deps import (
    BAD,
    LATEST_WINDOW_S,
    V1,
    Api,
    ApiState,
    acks_of_open,
    bad,
    site_or_404,
)
from twin.bands import bands
from twin.chain import phase_table, pumps_running

router = APIRouter(prefix=V1, tags=["twin"])


@router.get("/headroom", response_model=m.HeadroomResponse, responses=BAD)
def headroom(
    api: Api,
    kind: Annotated[str | None, Query(description=f"one of {', '.join(m.HEADROOM_KINDS)}")] = None,
    rack: str | None = None,
    cdu: str | None = None,
) -> m.HeadroomResponse:
    """The latest stored headroom report (the service recomputes it every --detect-every
    s): per limit, headroom now, its minimum over the horizon and the time to breach.
    ``rack=`` or ``cdu=`` naming no rack or CDU of the site is a 404 naming it."""
    if kind is not None and kind not in m.HEADROOM_KINDS:
        raise bad(f"unknown kind {kind!r}; expected one of {', '.join(m.HEADROOM_KINDS)}")
    _known_or_404(api, rack, cdu)
    computed_at, data_until, rows = queries.headroom_latest(api.ctx.db(), kind, rack, cdu)
    return m.HeadroomResponse(
        computed_at=computed_at,
        data_until=data_until,
        rows=[m.HeadroomRowOut(**r) for r in rows],
    )


def _known_or_404(api: ApiState, rack: str | None, cdu: str | None) -> None:
    """404 naming a rack or CDU the site does not have (without a site: one the latest
    headroom report does not name)."""
    if rack is None and cdu is None:
        return
    if api.ctx.site is not None:
        idx = api.site_index()
        where = f"site {idx.site.name!r}"
        racks, cdus = idx.rack_where.keys(), idx.site.cdu_by_name.keys()
    else:
        _, _, rows = queries.headroom_latest(api.ctx.db())
        where = "the latest headroom report"
        racks = {r["rack"] for r in rows if r["rack"]}
        cdus = {r["cdu"] for r in rows if r["cdu"]}
    if rack is not None and rack not in racks:
        raise bad(f"no rack {rack!r} in {where}", 404)
    if cdu is not None and cdu not in cdus:
        raise bad(f"no CDU {cdu!r} in {where}", 404)


@router.get(
    "/headroom/history",
    response_model=m.HeadroomHistoryResponse,
    responses=BAD,
)
def headroom_history(
    api: Api,
    hours: Annotated[float, Query(gt=0, le=168, description="hours back from now")] = 24.0,
) -> m.HeadroomHistoryResponse:
    """Per kind of limit, the share of its limit that the tightest one used in each stored
    headroom report of the last ``hours`` (the Overview's trend)."""
    start = datetime.now(UTC) - timedelta(hours=hours)
    kinds = queries.headroom_history(api.ctx.db(), start)
    return m.HeadroomHistoryResponse(start=start, kinds=[m.HeadroomKindHistory(**k) for k in kinds])


@router.get("/overview", response_model=m.Overview)
def overview(api: Api) -> m.Overview:
    """One call for the console's first page: IT power, cooling load, headroom summary,
    alert counts and ingest health."""
    db = api.ctx.db()
    newest = queries.newest_all(db)
    now = datetime.now(UTC)
    it_kw = gpu_kw = cool_kw = None
    n_nodes = n_gpus = 0
    if newest["node"] is not None:
        since = newest["node"] - timedelta(seconds=LATEST_WINDOW_S)
        n_nodes, s = queries.latest_power_total(db, "node", since)
        it_kw = None if s is None else s / 1000.0
    if newest["gpu"] is not None:
        since = newest["gpu"] - timedelta(seconds=LATEST_WINDOW_S)
        n_gpus, s = queries.latest_power_total(db, "gpu", since)
        gpu_kw = None if s is None else s / 1000.0
    if newest["cdu"] is not None:
        since = newest["cdu"] - timedelta(seconds=LATEST_WINDOW_S)
        cool_kw = queries.latest_cdu_heat_kw(db, since)
    cap = None
    if api.ctx.site is not None and api.ctx.site.cdus:
        caps = [c.capacity_kw for c in api.ctx.site.cdus if c.capacity_kw]
        cap = float(sum(caps)) if caps else None
    computed_at, summary, tight = queries.headroom_summary(db)
    active = api.active_alerts()
    acked = acks_of_open(db, active)
    by_sev: dict[str, int] = {}
    for a in active:
        by_sev[a["severity"]] = by_sev.get(a["severity"], 0) + 1
    counters = api.ctx.ingester.counters.as_dict() if api.ctx.ingester is not None else None
    dead = dict(queries.dead_letter_counts(db))
    data_until = max((t for t in newest.values() if t is not None), default=None)
    return m.Overview(
        site=api.ctx.site.name if api.ctx.site else None,
        data_until=data_until,
        it_power_kw=queries._f(it_kw),
        nodes_reporting=int(n_nodes),
        gpus_reporting=int(n_gpus),
        gpu_power_kw=queries._f(gpu_kw),
        cooling_load_kw=cool_kw,
        cooling_capacity_kw=cap,
        headroom_computed_at=computed_at,
        headroom=[m.HeadroomKindSummary(**s) for s in summary],
        tightest=[m.HeadroomRowOut(**r) for r in tight],
        alerts=m.AlertCounts(
            enabled=api.ctx.engine is not None,
            active=len(active),
            by_severity=by_sev,
            unacknowledged=sum(1 for a in active if a["dedup_key"] not in acked),
        ),
        ingest=m.IngestHealth(
            received=counters["received"] if counters else None,
            stored_messages=counters["stored_messages"] if counters else None,
            duplicates=counters["duplicates"] if counters else None,
            dead_letters_since_start=counters["dead_letters"] if counters else {},
            dead_letters_stored={k: int(v) for k, v in dead.items()},
            newest=newest,
            lag_s={
                k: None if t is None else round((now - t).total_seconds(), 3)
                for k, t in newest.items()
            },
            broker_connected=api.broker_connected(),
            write_errors=getattr(api.ctx.service, "write_errors", None),
        ),
    )


def _rack_summaries(
    api: ApiState, only: str | None = None
) -> tuple[datetime | None, list[m.RackSummary]]:
    """Every rack's summary, or rack ``only``'s alone (the same figures, read for its
    devices and headroom rows only: what ``/racks/{name}`` needs)."""
    idx = api.site_index()
    site = idx.site
    db = api.ctx.db()
    newest = queries.newest_all(db)
    chosen = [r for r in site.racks if only is None or r.name == only]

    def latest(kind: str, ids: list[str] | None, **kw: Any) -> dict[str, dict[str, Any]]:
        if newest[kind] is None:
            return {}
        since = newest[kind] - timedelta(seconds=LATEST_WINDOW_S)
        return queries.latest_by_id(db, kind, since, ids=ids, **kw)

    def ids(of: Any) -> list[str] | None:
        return None if only is None else [x for r in chosen for x in of(r)]

    node = latest(
        "node", ids(lambda r: [n.name for n in r.nodes]), quantities=["power_w", "inlet_temp_c"]
    )
    gpu = latest(
        "gpu",
        ids(lambda r: [g for n in r.nodes for g in (*n.gpu_ids(), *(n.gpu_uuids or ()))]),
        quantities=["temp_c", "util_pct"],
    )
    pdu = latest("pdu", ids(lambda r: list(r.pdus)), quantities=["inlet_temp_c"], id_filter="whole")
    if only is None:
        _, _, hrows = queries.headroom_latest(db)
    else:  # its GPUs' and its own rows, and the phases (a phase may feed several racks)
        at, _, hrows = queries.headroom_latest(db, rack=only)
        hrows = [r for r in hrows if r["kind"] != "pdu_phase"]
        if at is not None:
            hrows += queries.headroom_latest(db, "pdu_phase", computed_at=at)[2]
    rack_hr = {r["id"]: r for r in hrows if r["kind"] == "rack"}
    gpu_hr: dict[str, float] = {}
    pdu_hr: dict[str, float] = {}
    worst: dict[str, tuple[float, str]] = {}  # rack -> (largest share used [%], whose)
    by_kind: dict[str, dict[str, float]] = {}  # rack -> kind -> largest share used [%]
    band = bands()

    def used(rk: str, r: dict[str, Any], h: float) -> None:
        pct = band.used_pct(None if r["limit"] is None else r["limit"] - h, r["limit"], r["unit"])
        if pct is None:
            return
        if rk not in worst or pct > worst[rk][0]:
            worst[rk] = (pct, f"{r['kind']} {r['id']}")
        kinds = by_kind.setdefault(rk, {})
        kinds[r["kind"]] = max(kinds.get(r["kind"], pct), pct)

    for r in hrows:
        h = r["headroom_now"]
        if h is None:
            continue
        if r["kind"] == "gpu" and r["id"] in idx.gpu_node:
            rk = idx.node_rack[idx.gpu_node[r["id"]][0]]
            gpu_hr[rk] = min(gpu_hr.get(rk, h), h)
            used(rk, r, h)
        elif r["kind"] == "pdu_phase":
            for rk in idx.racks_of(r["id"]):
                pdu_hr[rk] = min(pdu_hr.get(rk, h), h)
                used(rk, r, h)
        elif r["kind"] == "rack":
            used(r["id"], r, h)
    alerts: dict[str, int] = {}
    for a in api.active_alerts():
        racks: set[str] = set()
        for e in [a["group"]["id"], *a["members"]]:
            racks |= idx.racks_of(e)
        for rk in racks:
            alerts[rk] = alerts.get(rk, 0) + 1
    out = []
    for r in chosen:
        hall, row = idx.rack_where[r.name]
        powers = [node[n.name]["power_w"] for n in r.nodes if n.name in node]
        powers = [p for p in powers if p is not None]
        temps, utils = [], []
        n_gpu = 0
        for n in r.nodes:
            for gid in n.gpu_ids():
                n_gpu += 1
                g = gpu.get(gid)
                if g is None and n.gpu_uuids:
                    g = gpu.get(n.gpu_uuids[int(gid.rsplit(":", 1)[1])])
                if g is not None:
                    if g["temp_c"] is not None:
                        temps.append(g["temp_c"])
                    if g["util_pct"] is not None:
                        utils.append(g["util_pct"])
        inlets = [node[n.name]["inlet_temp_c"] for n in r.nodes if n.name in node]
        inlets += [pdu[p]["inlet_temp_c"] for p in r.pdus if p in pdu]
        inlets = [t for t in inlets if t is not None]
        hr = rack_hr.get(r.name)
        out.append(
            m.RackSummary(
                name=r.name,
                hall=hall,
                row=row,
                grid_col=r.grid[0],
                grid_row=r.grid[1],
                cdu=r.cdu,
                pdus=list(r.pdus),
                fleet=idx.fleet_of_rack.get(r.name),
                nodes=len(r.nodes),
                gpus=n_gpu,
                power_kw=sum(powers) / 1000.0 if powers else None,
                power_limit_kw=hr["limit"] if hr else None,
                headroom_kw=hr["headroom_now"] if hr else None,
                gpu_temp_max_c=max(temps) if temps else None,
                gpu_headroom_min_k=gpu_hr.get(r.name),
                gpu_util_mean_pct=sum(utils) / len(utils) if utils else None,
                inlet_temp_c=max(inlets) if inlets else None,
                pdu_headroom_min_a=pdu_hr.get(r.name),
                limit_used_max_pct=worst[r.name][0] if r.name in worst else None,
                limit_used_max_of=worst[r.name][1] if r.name in worst else None,
                limit_used_pct=by_kind.get(r.name, {}),
                alerts=alerts.get(r.name, 0),
            )
        )
    until = max((t for t in newest.values() if t is not None), default=None)
    return until, out


@router.get("/racks", response_model=m.RacksResponse, responses=BAD)
def racks(api: Api) -> m.RacksResponse:
    """Every rack with its grid position and latest power, temperatures and headroom (the
    console's floor map)."""
    until, out = _rack_summaries(api)
    return m.RacksResponse(data_until=until, racks=out)


def _phase_rows(api: ApiState, pdu_names: list[str]) -> list[m.PhaseRow]:
    site = site_or_404(api.ctx)
    db = api.ctx.db()
    nw = queries.newest(db, "pdu")
    state = (
        {}
        if nw is None
        else queries.latest_by_id(
            db,
            "pdu",
            nw - timedelta(seconds=LATEST_WINDOW_S),
            quantities=["current_a", "voltage_v", "power_w"],
            id_filter="parts",
        )
    )
    _, _, hrows = queries.headroom_latest(db, "pdu_phase")
    hr = {r["id"]: r for r in hrows}
    out = []
    table = phase_table(site)  # every limit and its derating: twin.chain.limits
    legs: dict[str, list[int]] = {}
    for j, pdu in enumerate(table.pdu):
        legs.setdefault(pdu, []).append(j)
    for name in pdu_names:
        p = site.pdu_by_name[name]
        for j in legs.get(name, []):
            pid, rated, limit = table.ids[j], float(table.rated_a[j]), float(table.limit_a[j])
            s = state.get(pid, {})
            h = hr.get(pid)
            cur = queries._f(s.get("current_a"))
            out.append(
                m.PhaseRow(
                    id=pid,
                    pdu=p.name,
                    feed=p.feed,
                    current_a=cur,
                    voltage_v=queries._f(s.get("voltage_v")),
                    power_w=queries._f(s.get("power_w")),
                    rated_a=rated,
                    limit_a=limit,
                    headroom_a=h["headroom_now"] if h else (None if cur is None else limit - cur),
                    breach_in_s_p50=h["breach_in_s_p50"] if h else None,
                )
            )
    return out


def _cdu_rows(api: ApiState, names: list[str]) -> list[m.CduRow]:
    idx = api.site_index()
    site = idx.site
    db = api.ctx.db()
    nw = queries.newest(db, "cdu")
    state = (
        {}
        if nw is None
        else queries.latest_by_id(db, "cdu", nw - timedelta(seconds=LATEST_WINDOW_S))
    )
    at, _, hrows = queries.headroom_latest(db, "cdu")
    cdu_hr = {r["id"]: r for r in hrows if r["quantity"] == "heat_kw"}
    loop_rows = queries.headroom_latest(db, "loop", computed_at=at)[2] if at is not None else []
    loop_hr = {r["id"]: r for r in loop_rows}
    out = []
    for name in names:
        c = site.cdu_by_name[name]
        s = state.get(name, {})
        heat = queries._f(s.get("heat_kw"))
        pumps = []
        for pump in c.pumps:
            ps = state.get(sub_id(name, pump))
            speed = queries._f(ps.get("pump_speed_pct")) if ps else None
            pumps.append(
                m.PumpRow(
                    name=pump,
                    speed_pct=speed,
                    power_w=queries._f(ps.get("pump_power_w")) if ps else None,
                    running=None if speed is None else bool(pumps_running(speed)),
                )
            )
        out.append(
            m.CduRow(
                name=name,
                model=c.model,
                capacity_kw=c.capacity_kw,
                max_flow_lpm=c.max_flow_lpm,
                return_limit_c=c.return_limit_c,
                supply_temp_c=queries._f(s.get("supply_temp_c")),
                return_temp_c=queries._f(s.get("return_temp_c")),
                flow_lpm=queries._f(s.get("flow_lpm")),
                dp_kpa=queries._f(s.get("dp_kpa")),
                heat_kw=heat,
                fw_supply_temp_c=queries._f(s.get("fw_supply_temp_c")),
                fw_return_temp_c=queries._f(s.get("fw_return_temp_c")),
                capacity_used_pct=None
                if heat is None or not c.capacity_kw
                else 100.0 * heat / c.capacity_kw,
                headroom_kw=cdu_hr[name]["headroom_now"] if name in cdu_hr else None,
                return_headroom_k=loop_hr[name]["headroom_now"] if name in loop_hr else None,
                racks=idx.cdu_racks.get(name, []),
                pumps=pumps,
            )
        )
    return out


@router.get("/racks/{name}", response_model=m.RackDetail, responses=BAD)
def rack_detail(api: Api, name: str) -> m.RackDetail:
    """One rack: its nodes and GPUs, its PDU phases against their limits, its CDU loop."""
    idx = api.site_index()
    rack = next((r for r in idx.site.racks if r.name == name), None)
    if rack is None:
        raise bad(f"no rack {name!r} in site {idx.site.name!r}", 404)
    until, [summary] = _rack_summaries(api, only=name)
    db = api.ctx.db()
    node_ids = [n.name for n in rack.nodes]
    gpu_ids = [g for n in rack.nodes for g in (*n.gpu_ids(), *(n.gpu_uuids or ()))]

    def latest(kind: str, ids: list[str]) -> dict[str, dict[str, Any]]:
        nw = queries.newest(db, kind)
        if nw is None or not ids:
            return {}
        return queries.latest_by_id(db, kind, nw - timedelta(seconds=LATEST_WINDOW_S), ids=ids)

    node = latest("node", node_ids)
    gpu = latest("gpu", gpu_ids)
    _, _, ghr = queries.headroom_latest(db, "gpu", rack=name)
    gpu_hr = {r["id"]: r["headroom_now"] for r in ghr}
    nodes = []
    for n in rack.nodes:
        ns = node.get(n.name, {})
        gpus = []
        for i, gid in enumerate(n.gpu_ids()):
            g = gpu.get(gid) or (gpu.get(n.gpu_uuids[i]) if n.gpu_uuids else None) or {}
            gpus.append(
                m.GpuRow(
                    id=gid,
                    index=i,
                    power_w=queries._f(g.get("power_w")),
                    temp_c=queries._f(g.get("temp_c")),
                    mem_temp_c=queries._f(g.get("mem_temp_c")),
                    util_pct=queries._f(g.get("util_pct")),
                    sm_active=queries._f(g.get("sm_active")),
                    power_limit_w=queries._f(g.get("power_limit_w")),
                    headroom_k=gpu_hr.get(gid),
                )
            )
        nodes.append(
            m.NodeRow(
                name=n.name,
                model=n.model,
                gpu_model=n.gpu_model or n.spec.gpu,
                phase=n.phase,
                power_w=queries._f(ns.get("power_w")),
                inlet_temp_c=queries._f(ns.get("inlet_temp_c")),
                outlet_temp_c=queries._f(ns.get("outlet_temp_c")),
                fan_speed_pct=queries._f(ns.get("fan_speed_pct")),
                gpus=gpus,
            )
        )
    cdu = _cdu_rows(api, [rack.cdu])[0] if rack.cdu else None
    return m.RackDetail(
        data_until=until,
        rack=summary,
        nodes=nodes,
        phases=_phase_rows(api, list(rack.pdus)),
        cdu=cdu,
    )


@router.get("/power", response_model=m.PhasesResponse, responses=BAD)
def power(api: Api) -> m.PhasesResponse:
    """Every PDU phase and branch breaker: current against the 80 % derated limit."""
    site = site_or_404(api.ctx)
    return m.PhasesResponse(
        data_until=queries.newest(api.ctx.db(), "pdu"),
        phases=_phase_rows(api, [p.name for p in site.pdus]),
    )


@router.get("/cooling", response_model=m.CdusResponse, responses=BAD)
def cooling(api: Api) -> m.CdusResponse:
    """Every CDU: supply and return, flow, heat against capacity, pumps."""
    site = site_or_404(api.ctx)
    return m.CdusResponse(
        data_until=queries.newest(api.ctx.db(), "cdu"),
        cdus=_cdu_rows(api, [c.name for c in site.cdus]),
    )


@router.get("/network", response_model=m.LinksResponse, responses=BAD)
def network(api: Api) -> m.LinksResponse:
    """Every link: traffic each way against its capacity, errors, headroom."""
    site = site_or_404(api.ctx)
    db = api.ctx.db()
    nw = queries.newest(db, "link")
    state = (
        {}
        if nw is None
        else queries.latest_by_id(db, "link", nw - timedelta(seconds=LATEST_WINDOW_S))
    )
    _, _, hrows = queries.headroom_latest(db, "link")
    hr = {r["id"]: r for r in hrows}
    links = []
    for link in site.links:
        s = state.get(link.name, {})
        tx = queries._f(s.get("tx_bps"))
        rx = queries._f(s.get("rx_bps"))
        busier = max((v for v in (tx, rx) if v is not None), default=None)
        links.append(
            m.LinkRow(
                name=link.name,
                a=link.a,
                b=link.b,
                capacity_gbps=link.capacity_gbps,
                tx_gbps=None if tx is None else tx / 1e9,
                rx_gbps=None if rx is None else rx / 1e9,
                utilization_pct=None
                if busier is None
                else 100.0 * busier / 1e9 / link.capacity_gbps,
                errors=None if s.get("errors") is None else int(s["errors"]),
                headroom_gbps=hr[link.name]["headroom_now"] if link.name in hr else None,
            )
        )
    return m.LinksResponse(data_until=nw, links=links)
