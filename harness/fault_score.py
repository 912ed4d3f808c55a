"""Scoring of the pages a what-if replay sends against the faults a simulation injected.

The alert-quality benchmark (``bench/bench_alerts.py``) simulates days of a site with random
faults of every kind :mod:`twin.simulator.faults` injects, records and replays each day through
the alert evaluation ``dctwin whatif`` uses, and scores the pages here against the simulator's
ground truth (:meth:`twin.simulator.SiteSimulator.true_state`): which faults were paged, the
lead from the first page to the limit crossing, pages tied to no fault, incidents with more
than two pages. The benchmark's docstring gives the attribution and crossing rules.

Benchmark support (tests/test_bench_alerts.py runs it too); it is not shipped in the wheel.
"""

from __future__ import annotations

import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from twin.simulator.faults import FAULT_KINDS, RAMPED_KINDS, Fault
from twin.site import Site, load_site

#: The first simulated day: the demo bundle's (a Monday), so day 5 and 6 fall on a weekend.
START = datetime(2026, 11, 23, tzinfo=UTC)
#: The simulator's thermal controller caps a GPU's power from max_operating_temp_c - 0.5 K
#: (twin/simulator/engine.py, _thermal_control), so the true temperature stops there. [K]
GPU_AT_LIMIT_K = 0.5
#: Calibration window at the start of each day, before any fault (make_demo_bundle.py uses 2 h). [s]
CALIBRATION_S = 7200.0
CALIBRATION_HOLDOUT_S = 1200.0

#: Per kind: (start range as fractions of the day after calibration, duration range [s],
#: magnitude range or None for the simulator's default). Ramped kinds: the duration is the ramp.
FAULT_DRAWS: dict[
    str, tuple[tuple[float, float], tuple[float, float], tuple[float, float] | None]
] = {
    # R x1.5 .. x3: a degraded TIM up to the demo day's cold plate (R x3)
    "cold_plate": ((0.0, 0.9), (3600.0, 3 * 3600.0), (0.5, 2.0)),
    "cold_plate_decay": ((0.0, 0.75), (3600.0, 4 * 3600.0), (1.0, 2.0)),
    "pump_failure": ((0.0, 0.95), (900.0, 3600.0), None),
    # default: the phase taken to 95 % of its rating, over the 80 % derated limit
    "phase_overload": ((0.0, 0.95), (900.0, 3600.0), None),
    "phase_creep": ((0.0, 0.75), (3600.0, 3 * 3600.0), None),
    "fleet_idle": ((0.0, 0.85), (3600.0, 4 * 3600.0), None),
}

#: Faults that touch many entities first, so that the small ones fit around them.
DRAW_ORDER = (
    "pump_failure",
    "phase_overload",
    "phase_creep",
    "cold_plate",
    "cold_plate_decay",
    "fleet_idle",
)
Entity = tuple[str, str]


# ---- faults and their entities ---------------------------------------------------------------


def fault_targets(site: Site, kind: str) -> list[str]:
    """Every target the simulator accepts for ``kind``, in site order."""
    if kind in ("cold_plate", "cold_plate_decay"):
        return [g for n in site.nodes for g in n.gpu_ids()]
    if kind == "pump_failure":
        return [f"{c.name}/{p}" for c in site.cdus for p in c.pumps]
    if kind in ("phase_overload", "phase_creep"):
        return [
            f"{p.name}/L{k}" for p in site.pdus for k in range(1, (3 if p.phases == 3 else 1) + 1)
        ]
    if kind == "fleet_idle":
        return [f.name for f in site.fleets]
    raise ValueError(f"unknown fault kind {kind!r}; expected one of {FAULT_KINDS}")


def related_entities(site: Site, kind: str, target: str) -> set[Entity]:
    """The entities a page may name and be tied to a fault of ``kind`` on ``target``."""
    out: set[Entity] = set()
    if kind in ("cold_plate", "cold_plate_decay"):
        node = target.rsplit(":", 1)[0]
        rack = site.rack_of_node[node].name
        return {("gpu", target), ("node", node), ("rack", rack)}
    if kind == "pump_failure":
        cdu = target.split("/", 1)[0]
        out |= {("cdu", cdu), ("cdu", target), ("loop", cdu)}
        for r in site.racks:
            if r.cdu == cdu:
                out.add(("rack", r.name))
                for n in r.nodes:
                    out.add(("node", n.name))
                    out |= {("gpu", g) for g in n.gpu_ids()}
        return out
    if kind in ("phase_overload", "phase_creep"):
        pdu_name = target.split("/", 1)[0]
        pdu = site.pdu_by_name[pdu_name]
        out.add(("pdu", pdu_name))
        for k in range(1, (3 if pdu.phases == 3 else 1) + 1):
            out.add(("pdu_phase", f"{pdu_name}/L{k}"))
        for b in pdu.breakers:
            out |= {("pdu", f"{pdu_name}/{b.name}"), ("pdu_phase", f"{pdu_name}/{b.name}")}
        out |= {("rack", r.name) for r in site.racks if pdu_name in r.pdus}
        return out
    if kind == "fleet_idle":
        return {("fleet", target)}
    raise ValueError(f"unknown fault kind {kind!r}")


@dataclass
class FaultCase:
    """One injected fault with its window, related entities and ground truth (seconds from
    the day's start)."""

    day: int
    kind: str
    target: str
    start_s: float
    end_s: float  # the end of its active window (a ramped fault: the day's end)
    spec: str
    related: set[Entity] = field(default_factory=set, repr=False)
    crossing_s: float | None = None  # first limit crossing (ground truth), None: none
    crossing: str = ""  # what crossed first
    pages: list[float] = field(default_factory=list)  # tied firing notifications [s]
    notifications: int = 0  # tied firing + resolved


def draw_faults(
    site: Site, rng: np.random.Generator, day_s: float, per_kind: int, t0_s: float
) -> list[Fault]:
    """``per_kind`` faults of every kind at random times (after ``t0_s``) and targets whose
    related entities do not overlap those already drawn (up to 50 tries, then any)."""
    faults: list[Fault] = []
    taken: set[Entity] = set()
    span = max(day_s - t0_s, 60.0)
    for kind in DRAW_ORDER:
        (lo, hi), (d_lo, d_hi), mag = FAULT_DRAWS[kind]
        targets = fault_targets(site, kind)
        for _ in range(per_kind):
            start = t0_s + float(rng.uniform(lo, hi)) * span
            dur = float(rng.uniform(d_lo, d_hi))
            if day_s < 6 * 3600:  # a short test day: keep the faults inside it
                dur = min(dur, max(0.5 * (day_s - start), 600.0))
            magnitude = None if mag is None else round(float(rng.uniform(*mag)), 3)
            for _try in range(50):
                target = targets[int(rng.integers(len(targets)))]
                rel = related_entities(site, kind, target)
                if not rel & taken:
                    break
            taken |= rel
            faults.append(
                Fault(
                    kind=kind,  # type: ignore[arg-type]
                    target=target,
                    start_s=round(start),
                    duration_s=round(dur),
                    magnitude=magnitude,
                )
            )
    return sorted(faults, key=lambda f: FAULT_KINDS.index(f.kind))


# ---- ground truth ------------------------------------------------------------------------------


@dataclass
class Truth:
    """The simulator's true values at every tick of one day."""

    t_s: np.ndarray  # (T,) seconds from the day's start
    gpu_ids: list[str]
    gpu_temp_c: np.ndarray  # (T, G)
    current_ids: list[str]  # phase lines and breakers, twin.chain.limits.phase_table order
    current_a: np.ndarray  # (T, P)
    cdu_names: list[str]
    cdu: dict[str, np.ndarray]  # heat_kw, flow_lpm, supply_c, return_c: (T, C)


class TruthRecorder:
    """Collects ``SiteSimulator.true_state()`` tick by tick on the site's limit layout."""

    def __init__(self, site: Site) -> None:
        from twin.chain import phase_table

        self.site = site
        self.phases = phase_table(site)
        self.t: list[float] = []
        self.temp: list[np.ndarray] = []
        self.cur: list[np.ndarray] = []
        self.cdu: dict[str, list[np.ndarray]] = {
            k: [] for k in ("heat_kw", "flow_lpm", "supply_c", "return_c")
        }
        self._cols: np.ndarray | None = None
        self.gpu_ids: list[str] = []
        self.cdu_names: list[str] = []

    def add(self, t_s: float, st: dict[str, Any]) -> None:
        if self._cols is None:
            pos = {x: i for i, x in enumerate(st["phase_ids"])}
            nb = len(st["phase_ids"])
            pos |= {x: nb + i for i, x in enumerate(st["breaker_ids"])}
            self._cols = np.array([pos.get(x, -1) for x in self.phases.ids], np.int64)
            self.gpu_ids, self.cdu_names = st["gpu_ids"], st["cdu_names"]
        both = np.concatenate([st["line_current_a"], st["breaker_current_a"], [np.nan]])
        self.t.append(t_s)
        self.temp.append(st["gpu_temp_c"].astype(np.float32))
        self.cur.append(both[self._cols].astype(np.float32))
        for k in self.cdu:
            self.cdu[k].append(np.asarray(st[f"cdu_{k}"], float))

    def done(self) -> Truth:
        return Truth(
            np.array(self.t),
            self.gpu_ids,
            np.array(self.temp),
            list(self.phases.ids),
            np.array(self.cur),
            self.cdu_names,
            {k: np.array(v) for k, v in self.cdu.items()},
        )


def _first(t_s: np.ndarray, over: np.ndarray, lo: float, hi: float) -> float | None:
    """First time in [lo, hi] where ``over`` (T,) holds."""
    ok = over & (t_s >= lo) & (t_s <= hi)
    return float(t_s[np.argmax(ok)]) if ok.any() else None


def crossing(
    site: Site, truth: Truth, case: FaultCase, margin_s: float
) -> tuple[float | None, str]:
    """The fault's first limit crossing in its window (ground truth) and what crossed."""
    from twin.chain.propagate import cdu_capacity_kw, flow_needed_lpm

    lo, hi = case.start_s, case.end_s + margin_s
    t = truth.t_s
    found: list[tuple[float, str]] = []
    gpu_pos = {g: i for i, g in enumerate(truth.gpu_ids)}

    def gpus(ids: Iterable[str]) -> None:
        cols = [gpu_pos[g] for g in ids if g in gpu_pos]
        if not cols:
            return
        lim = np.array([_max_op_c(site, truth.gpu_ids[c]) for c in cols]) - GPU_AT_LIMIT_K
        over = truth.gpu_temp_c[:, cols] >= lim[None, :]
        at = _first(t, over.any(axis=1), lo, hi)
        if at is not None:
            k = int(np.argmax(over[np.searchsorted(t, at)]))
            found.append((at, f"gpu {truth.gpu_ids[cols[k]]} at max operating temperature"))

    if case.kind in ("cold_plate", "cold_plate_decay"):
        gpus([case.target])
    elif case.kind == "pump_failure":
        name = case.target.split("/", 1)[0]
        cdu = next(c for c in site.cdus if c.name == name)
        gpus(g for e_kind, g in case.related if e_kind == "gpu")
        i = truth.cdu_names.index(cdu.name)
        heat, flow = truth.cdu["heat_kw"][:, i], truth.cdu["flow_lpm"][:, i]
        cap = np.asarray(cdu_capacity_kw(cdu.capacity_kw, flow, cdu.max_flow_lpm), float)
        need = np.asarray(
            flow_needed_lpm(heat, truth.cdu["supply_c"][:, i], cdu.return_limit_c, cdu.coolant),
            float,
        )
        for what, over in (
            (f"cdu {cdu.name} heat over capacity", heat > cap),
            (f"cdu {cdu.name} flow below need", need > flow),
            (
                f"loop {cdu.name} return over limit",
                truth.cdu["return_c"][:, i] > cdu.return_limit_c,
            ),
        ):
            at = _first(t, over, lo, hi)
            if at is not None:
                found.append((at, what))
    elif case.kind in ("phase_overload", "phase_creep"):
        from twin.chain import phase_table

        ph = phase_table(site)
        pdu = case.target.split("/", 1)[0]
        cols = [j for j, p in enumerate(ph.pdu) if p == pdu]
        over = truth.current_a[:, cols] > ph.limit_a[cols][None, :]
        at = _first(t, over.any(axis=1), lo, hi)
        if at is not None:
            k = int(np.argmax(over[np.searchsorted(t, at)]))
            found.append((at, f"{ph.ids[cols[k]]} over its derated limit"))
    if not found:
        return None, ""
    return min(found)


_MAX_OP: dict[str, float] = {}


def _max_op_c(site: Site, gpu: str) -> float:
    node = gpu.rsplit(":", 1)[0]
    if node not in _MAX_OP:
        n = next(x for x in site.nodes if x.name == node)
        _MAX_OP[node] = float(n.gpu_spec.max_operating_temp_c)
    return _MAX_OP[node]


# ---- untied pages against the truth -------------------------------------------------------------

#: Classes of a page tied to no fault (bench_alerts): the simulated truth shows the rule's
#: quantity in its alert state (a true limit state the site reaches with no fault injected),
#: or it does not (a false page).
LIMIT_STATE, FALSE_PAGE = "limit_state", "false"
CLASSES = (LIMIT_STATE, FALSE_PAGE)


def _true_quantity(
    site: Site, truth: Truth, metric: str, entity: str
) -> tuple[np.ndarray, float] | None:
    """(headroom-now series (T,), the headroom at which the limit is reached) of ``metric``
    for ``entity`` from the simulator's truth: the quantity the rule judges, in the rule's own
    unit (a GPU reaches its limit GPU_AT_LIMIT_K short of it, where the simulator caps it);
    None where the truth does not hold it."""
    from twin.alerts import metrics as mt

    if metric in (mt.HEADROOM_GPU_K_TO_SLOWDOWN, mt.HEADROOM_GPU_TIME_TO_BREACH_P90_S):
        if entity not in truth.gpu_ids:
            return None
        temp = truth.gpu_temp_c[:, truth.gpu_ids.index(entity)].astype(float)
        return _max_op_c(site, entity) - temp, GPU_AT_LIMIT_K
    if metric in (mt.HEADROOM_PDU_PHASE_A_TO_LIMIT, mt.HEADROOM_PDU_PHASE_TIME_TO_BREACH_P50_S):
        from twin.chain import phase_table

        ph = phase_table(site)
        if entity not in truth.current_ids:
            return None
        j = truth.current_ids.index(entity)
        return float(ph.limit_a[j]) - truth.current_a[:, j].astype(float), 0.0
    if metric in (mt.HEADROOM_CDU_FREE_FRACTION, mt.HEADROOM_CDU_TIME_TO_BREACH_P50_S):
        from twin.chain.propagate import cdu_capacity_kw

        cdu = next((c for c in site.cdus if c.name == entity), None)
        if cdu is None or cdu.name not in truth.cdu_names:
            return None
        i = truth.cdu_names.index(cdu.name)
        heat, flow = truth.cdu["heat_kw"][:, i], truth.cdu["flow_lpm"][:, i]
        cap = np.asarray(cdu_capacity_kw(cdu.capacity_kw, flow, cdu.max_flow_lpm), float)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(cap > 0, (cap - heat) / cap, np.nan), 0.0
    return None


def classify_untied(
    site: Site, truth: Truth, rules: Any, untied: list[dict[str, Any]], known: set[str]
) -> None:
    """Mark each untied page ``truth_class`` :data:`LIMIT_STATE` or :data:`FALSE_PAGE` (with
    ``truth_value``, the true quantity it was judged on), from the simulator's truth, never
    from the alert: a threshold rule's page is a limit state when the true quantity's mean over
    the minute before the page meets the rule's condition (op, value: the rule's margin); a
    forecast rule's when the true headroom reaches 0 within the rule's horizon after the page.
    Any other page (a rule on a quantity the truth does not hold, or the truth not in the
    rule's state) is false."""
    by_name = rules.by_name()
    t = truth.t_s
    for u in untied:
        u["truth_class"], u["truth_value"] = FALSE_PAGE, None
        rule = by_name.get(str(u.get("rule")))
        if rule is None:
            continue
        ents = [i for k, i in page_entities(u, known) if k in ("*", rule.entity_kind)]
        group = str(u.get("group", "")).partition(" ")[2]
        for ent in dict.fromkeys([*ents, group]):
            q = _true_quantity(site, truth, rule.metric, ent)
            if q is None:
                continue
            series, at_limit = q
            t_s = float(u["t_s"])
            if rule.type == "forecast_breach":
                win = (t >= t_s) & (t <= t_s + float(rule.horizon_s or 3600.0))
                v = float(np.nanmin(series[win])) if win.any() else float("nan")
                hit = v <= at_limit
            else:
                win = (t > t_s - 60.0) & (t <= t_s)
                v = float(np.nanmean(series[win])) if win.any() else float("nan")
                hit = bool(rule.breached(v)) if np.isfinite(v) else False
            if np.isfinite(v):
                u["truth_value"] = round(v, 4)
            if hit:
                u["truth_class"] = LIMIT_STATE
                break


# ---- pages, attribution, scoring ---------------------------------------------------------------


#: Severities that page on-call; ``info`` is a ticket (deploy/alert_rules.yaml's header).
PAGING_SEVERITIES = ("critical", "warning")
#: Fault kinds that act at once (a step): they cross their limit within the first minutes,
#: before a minute-sampled detector has seen them twice (bench/README.md: bench_alerts.py).
STEP_KINDS = ("cold_plate", "phase_overload")


def _first_notice(alert: dict[str, Any]) -> bool:
    """A ``firing`` notification that is not a reminder of an open incident (a
    repeat-interval re-send, where the replay marks it ``reminder`` or ``repeat``)."""
    if alert.get("status") != "firing":
        return False
    return not (alert.get("reminder") or alert.get("repeat"))


def is_page(alert: dict[str, Any]) -> bool:
    """A page: the first notice of an incident of a paging severity (critical, warning; an
    alert without a severity counts as a page)."""
    return _first_notice(alert) and str(alert.get("severity", "warning")) in PAGING_SEVERITIES


def is_ticket(alert: dict[str, Any]) -> bool:
    """A ticket: the first notice of an incident of severity ``info`` (not paged)."""
    return _first_notice(alert) and str(alert.get("severity", "warning")) not in PAGING_SEVERITIES


def page_entities(alert: dict[str, Any], known: set[str]) -> set[Entity]:
    """The entities one notification names: its group, its members (where the replay lists
    them), and every known entity id its summary mentions (of any kind: matched by id)."""
    out: set[Entity] = set()
    group = alert.get("group", "")
    if isinstance(group, dict):  # {"kind", "id"}, as a Notification's GroupRef
        kind, gid = str(group.get("kind", "")), str(group.get("id", ""))
    else:
        kind, _, gid = str(group).partition(" ")
    if gid:
        out.add((kind, gid))
    for m in alert.get("members") or ():
        if isinstance(m, dict) and m.get("entity_id"):
            out.add((str(m.get("entity_kind", "")), str(m["entity_id"])))
    for tok in re.findall(
        r"[A-Za-z0-9][A-Za-z0-9_.:/-]*[A-Za-z0-9]", str(alert.get("summary", ""))
    ):
        if tok in known:
            out.add(("*", tok))
    return out


def _matches(ents: set[Entity], related: set[Entity]) -> bool:
    ids = {i for _, i in related}
    return any(((k, i) in related) or (k == "*" and i in ids) for k, i in ents)


def attribute(
    faults: list[FaultCase],
    alerts: list[dict[str, Any]],
    t0: datetime,
    known: set[str],
    margin_s: float,
) -> list[dict[str, Any]]:
    """Tie each notification to the faults it names within their window; returns the firing
    notifications tied to none (with ``t_s``). Fills each fault's ``pages`` and
    ``notifications``."""
    untied: list[dict[str, Any]] = []
    for a in alerts:
        at = datetime.fromisoformat(str(a["at"]).replace("Z", "+00:00"))
        t_s = (at - t0).total_seconds()
        ents = page_entities(a, known)
        hit = False
        for f in faults:
            if f.start_s <= t_s <= f.end_s + margin_s and _matches(ents, f.related):
                hit = True
                f.notifications += 1
                if is_page(a):
                    f.pages.append(t_s)
        if not hit and is_page(a):
            untied.append({**a, "t_s": t_s})
    return untied


def _stats(xs: list[float]) -> dict[str, float | None]:
    return {
        "median": round(statistics.median(xs), 2) if xs else None,
        "min": round(min(xs), 2) if xs else None,
    }


def score(
    faults: list[FaultCase], untied: list[dict[str, Any]], days: float, gpus: int
) -> dict[str, Any]:
    """Per fault kind and over the run (lead times in minutes)."""
    kinds: dict[str, Any] = {}
    for kind in FAULT_KINDS:
        fs = [f for f in faults if f.kind == kind]
        crossed = [f for f in fs if f.crossing_s is not None]
        before = [f for f in crossed if f.pages and min(f.pages) <= f.crossing_s]  # type: ignore[operator]
        lead = [
            ((f.crossing_s if f.crossing_s is not None else f.start_s) - min(f.pages)) / 60.0
            for f in fs
            if f.pages
        ]
        lead_x = [(f.crossing_s - min(f.pages)) / 60.0 for f in crossed if f.pages]  # type: ignore[operator]
        kinds[kind] = {
            "faults": len(fs),
            "paged": sum(1 for f in fs if f.pages),
            "paged_share": round(sum(1 for f in fs if f.pages) / len(fs), 3) if fs else None,
            "crossed": len(crossed),
            "paged_before_crossing": len(before),
            "paged_before_crossing_share": round(len(before) / len(crossed), 3)
            if crossed
            else None,
            "lead_min": _stats(lead),
            "lead_to_crossing_min": _stats(lead_x),
            "pages": sum(len(f.pages) for f in fs),
            "max_pages_per_fault": max((len(f.pages) for f in fs), default=0),
            "faults_over_2_pages": sum(1 for f in fs if len(f.pages) > 2),
        }
    crossed = [f for f in faults if f.crossing_s is not None]
    before = [f for f in crossed if f.pages and min(f.pages) <= f.crossing_s]  # type: ignore[operator]
    ramp_x = [f for f in crossed if f.kind not in STEP_KINDS]
    ramp_before = [f for f in before if f.kind not in STEP_KINDS]
    ramp_share = len(ramp_before) / len(ramp_x) if ramp_x else None
    # an incident lives within one day's replay (each day is its own run): key by day too
    keys: dict[tuple[str, str, str], int] = {}
    for a in untied:
        k = (str(a.get("day", "")), str(a.get("rule")), str(a.get("group")))
        keys[k] = keys.get(k, 0) + 1
    untied_over_2 = {
        (f"day {d}: " if d else "") + f"{r} {g}": n for (d, r, g), n in keys.items() if n > 2
    }
    by_rule: dict[str, int] = {}
    for a in untied:
        by_rule[str(a.get("rule"))] = by_rule.get(str(a.get("rule")), 0) + 1
    per_day_k = len(untied) / days / (gpus / 1000.0) if days > 0 and gpus else float("nan")
    by_class = {c: sum(1 for a in untied if a.get("truth_class") == c) for c in CLASSES}
    false_k = by_class[FALSE_PAGE] / days / (gpus / 1000.0) if days > 0 and gpus else float("nan")
    over_2 = sum(1 for f in faults if len(f.pages) > 2) + len(untied_over_2)
    slow = {
        k: kinds[k]["lead_to_crossing_min"]["median"] for k in ("cold_plate_decay", "phase_creep")
    }
    share = len(before) / len(crossed) if crossed else None
    return {
        "kinds": kinds,
        "faults": len(faults),
        "crossed": len(crossed),
        "paged_before_crossing": len(before),
        "paged_before_crossing_share": round(share, 3) if share is not None else None,
        "ramped_crossed": len(ramp_x),
        "ramped_paged_before_crossing": len(ramp_before),
        "ramped_paged_before_crossing_share": round(ramp_share, 3)
        if ramp_share is not None
        else None,
        "untied_pages": len(untied),
        "untied_pages_by_rule": dict(sorted(by_rule.items())),
        "untied_pages_per_day_per_1000_gpus": round(per_day_k, 3),
        "tied_pages": sum(len(f.pages) for f in faults),
        "untied_pages_by_class": by_class,
        "false_pages_per_day_per_1000_gpus": round(false_k, 3),
        "incidents_over_2_pages": over_2,
        "untied_keys_over_2_pages": untied_over_2,
        "targets": {
            "paged_before_crossing_share >= 0.95": share is not None and share >= 0.95,
            "faults with a ramp: paged_before_crossing_share >= 0.95": ramp_share is not None
            and ramp_share >= 0.95,
            **{
                f"{k} median lead to crossing >= 10 min": v is not None and v >= 10.0
                for k, v in slow.items()
            },
            "untied pages/day/1000 GPUs <= 1": per_day_k <= 1.0,
            "no incident with > 2 pages": over_2 == 0,
        },
    }


# ---- one day -----------------------------------------------------------------------------------


def run_day(
    site_path: Path,
    rules_path: Path,
    day: int,
    seed: int,
    hours: float,
    resolution_s: float,
    tick_s: float,
    per_kind: int,
    margin_s: float,
    keep: Path | None,
) -> tuple[list[FaultCase], list[dict[str, Any]], dict[str, Any]]:
    """Simulate, record, replay and attribute one day; returns its faults, untied pages, info.

    The simulator steps every ``tick_s``; the ingest gets every ``resolution_s / tick_s``-th
    tick's messages (a poller reading every ``resolution_s``); the truth is kept every tick.
    """
    from twin.alerts import load_rules
    from twin.calibrate.calibrate import calibrate, save_run
    from twin.ingest import Ingester, IngestLimits
    from twin.replay.bundle import Bundle, record
    from twin.replay.whatif import load, run
    from twin.simulator import SiteSimulator
    from twin.store import Store

    site = load_site(site_path)
    day_s = hours * 3600.0
    t0 = START + timedelta(days=day)
    rng = np.random.default_rng([seed, day])
    cal_s = min(CALIBRATION_S, day_s / 4)
    faults = draw_faults(site, rng, day_s, per_kind, cal_s)
    sim_seed = int(rng.integers(2**31))
    sim = SiteSimulator(site, seed=sim_seed, start=t0, rate_hz=1.0 / tick_s, faults=faults)
    truth = TruthRecorder(site)
    ticks = round(day_s / tick_s)
    every = max(1, round(resolution_s / tick_s))
    timing: dict[str, float] = {}
    c0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = (keep / f"day{day}") if keep else Path(tmp) / "bundle"
        with Store(Path(tmp) / "day.duckdb") as store:
            ing = Ingester(store, site, IngestLimits(max_past_s=0))
            batch: list[tuple[str, bytes]] = []
            for k in range(ticks):
                if k % every == 0:
                    batch.extend(sim.step())
                else:
                    sim.advance()
                truth.add(k * tick_s, sim.true_state())
                if len(batch) >= 50_000:
                    ing.ingest(batch)
                    batch = []
            ing.ingest(batch)
            timing["simulate_ingest_s"] = time.perf_counter() - c0
            c1 = time.perf_counter()
            try:
                hold = min(CALIBRATION_HOLDOUT_S, cal_s / 4)
                res = calibrate(
                    store, site, end=t0 + timedelta(seconds=cal_s), window_s=cal_s, holdout_s=hold
                )
                save_run(store, res)
            except ValueError as e:  # too short a window: the twin falls back to the catalog
                print(f"day {day}: no calibration ({e})", file=sys.stderr)
            timing["calibrate_s"] = time.perf_counter() - c1
            c2 = time.perf_counter()
            end = t0 + timedelta(seconds=ticks * tick_s)
            record(
                store,
                site_path,
                out,
                t0,
                end,
                resolution_s=resolution_s,
                notes=f"bench_alerts day {day}, seed {seed}: {'; '.join(map(str, faults))}",
                overwrite=True,
            )
            timing["record_s"] = time.perf_counter() - c2
        c3 = time.perf_counter()
        rules = load_rules(rules_path)
        result = run(load(Bundle.load(out)), None, rules)
        timing["whatif_s"] = time.perf_counter() - c3
    tr = truth.done()
    cases = []
    for f in faults:
        end_s = (
            day_s if (f.kind in RAMPED_KINDS or f.duration_s is None) else f.start_s + f.duration_s
        )
        case = FaultCase(day, f.kind, f.target, f.start_s, min(end_s, day_s), str(f))
        case.related = related_entities(site, f.kind, f.target)
        case.crossing_s, case.crossing = crossing(site, tr, case, margin_s)
        cases.append(case)
    known = known_ids(site)
    untied = attribute(cases, list(result.alerts), t0, known, margin_s)
    classify_untied(site, tr, rules, untied, known)
    for u in untied:
        u["day"] = day
    info = {
        "day": day,
        "start": t0.isoformat(),
        "sim_seed": sim_seed,
        "notifications": len(result.alerts),
        "pages": sum(1 for a in result.alerts if is_page(a)),
        "tickets": sum(1 for a in result.alerts if is_ticket(a)),
        "tickets_by_rule": _by_rule([a for a in result.alerts if is_ticket(a)]),
        "page_keys": sorted(
            {f"{a['rule']}|{a['group']}" for a in result.alerts if is_page(a) and not a["repeat"]}
        ),
        "timing_s": {k: round(v, 1) for k, v in timing.items()},
    }
    return cases, untied, info


def _by_rule(alerts: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for a in alerts:
        out[str(a.get("rule"))] = out.get(str(a.get("rule")), 0) + 1
    return dict(sorted(out.items()))


def known_ids(site: Site) -> set[str]:
    """Every entity id of the site an alert can name: the sample ids the site knows
    (``Site.known_ids``: GPUs and their UUIDs, nodes, PDUs, phases, breakers, CDUs, pumps,
    links), its racks and its fleets."""
    racks_fleets = [r.name for r in site.racks] + [f.name for f in site.fleets]
    return set().union(*site.known_ids.values(), racks_fleets)


# ---- output ------------------------------------------------------------------------------------
