"""Tests of twin/simulator: fault syntax, determinism, the wire contract, physics, faults."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from collectors.contract import QUANTITIES, decode, parse_topic
from models import electrical
from twin.simulator import Fault, SiteSimulator, parse_fault
from twin.site import Site

from .helpers import wye_pdu

START = datetime(2026, 11, 29, 2, 0, tzinfo=UTC)  # night: the inference fleet is near its floor
SEED = 3
TICKS = 300


SMALL_SITE: dict[str, Any] = {
    "name": "small",
    "halls": [
        {
            "name": "hall-a",
            "rows": [
                {
                    "name": "row-a",
                    "racks": [
                        {
                            "name": "rack-a01",
                            "grid": [0, 0],
                            "pdus": ["pdu-a01-a", "pdu-a01-b"],
                            "cdu": "cdu-1",
                            "nodes": [
                                {"name": "trn-a01-n1", "model": "HGX-H200-8-DLC"},
                                {"name": "inf-a01-n2", "model": "HGX-H200-8-DLC"},
                            ],
                        },
                        {
                            "name": "rack-a02",
                            "grid": [1, 0],
                            "pdus": ["pdu-a02-a", "pdu-a02-b"],
                            "nodes": [{"name": "trn-a02-n1", "model": "HGX-H100-8"}],
                        },
                    ],
                }
            ],
        }
    ],
    "pdus": [
        wye_pdu("pdu-a01-a", "A", "br"),
        wye_pdu("pdu-a01-b", "B", "br"),
        wye_pdu("pdu-a02-a", "A", "br"),
        {
            "name": "pdu-a02-b",
            "feed": "B",
            "wiring": "delta",
            "voltage_v": 208,
            "rated_current_a": 30,
            "breakers": [
                {"name": "br1", "phase": "L1-L2", "rated_current_a": 30},
                {"name": "br2", "phase": "L2-L3", "rated_current_a": 30},
                {"name": "br3", "phase": "L3-L1", "rated_current_a": 30},
            ],
        },
    ],
    "cdus": [
        {
            "name": "cdu-1",
            "capacity_kw": 40,
            "approach_k": 4,
            "max_flow_lpm": 30,
            "pumps": ["pump1", "pump2"],
        }
    ],
    "switches": [
        {"name": "leaf-a01", "role": "leaf", "rack": "rack-a01"},
        {"name": "leaf-a02", "role": "leaf", "rack": "rack-a02"},
        {"name": "spine-1", "role": "spine"},
    ],
    "links": [
        {"name": "trn-a01-n1-up", "a": "trn-a01-n1", "b": "leaf-a01", "capacity_gbps": 400},
        {"name": "inf-a01-n2-up", "a": "inf-a01-n2", "b": "leaf-a01", "capacity_gbps": 400},
        {"name": "trn-a02-n1-up", "a": "trn-a02-n1", "b": "leaf-a02", "capacity_gbps": 400},
        {"name": "leaf-a01-spine-1", "a": "leaf-a01", "b": "spine-1", "capacity_gbps": 800},
        {"name": "leaf-a02-spine-1", "a": "leaf-a02", "b": "spine-1", "capacity_gbps": 800},
    ],
    "fleets": [
        {"name": "train-llm", "role": "training", "members": ["trn-a01-n1", "trn-a02-n1"]},
        {"name": "infer-chat", "role": "inference", "members": ["inf-a01-n2"]},
    ],
}

Rows = list[dict[tuple[str, str], dict[str, Any]]]


@pytest.fixture(scope="module")
def site() -> Site:
    return Site.model_validate(SMALL_SITE)


def make(
    site: Site, faults: Sequence[str] = (), seed: int = SEED, rate_hz: float = 1.0
) -> SiteSimulator:
    return SiteSimulator(
        site, seed=seed, start=START, rate_hz=rate_hz, faults=[parse_fault(f) for f in faults]
    )


def collect(sim: SiteSimulator, n: int) -> Rows:
    """Run n ticks; per tick, every decoded sample keyed by (kind, id)."""
    rows: Rows = []
    for _ in range(n):
        tick: dict[tuple[str, str], dict[str, Any]] = {}
        for topic, payload in sim.step():
            msg = decode(topic, payload)
            for s in msg.samples:
                tick[(msg.kind, s["id"])] = s
        rows.append(tick)
    return rows


def series(
    rows: Rows, kind: str, sid: str, q: str, lo: int = 0, hi: int | None = None
) -> np.ndarray:
    return np.array([r[(kind, sid)][q] for r in rows[lo:hi]], dtype=float)


@pytest.fixture(scope="module")
def baseline(site: Site) -> tuple[SiteSimulator, Rows]:
    sim = make(site)
    return sim, collect(sim, TICKS)


def run_with(site: Site, *faults: str) -> tuple[SiteSimulator, Rows]:
    sim = make(site, list(faults))
    return sim, collect(sim, TICKS)


# ---- fault syntax ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "kind", "target", "start", "duration", "magnitude"),
    [
        ("cold_plate:trn-a01-n1:3@10m", "cold_plate", "trn-a01-n1:3", 600.0, None, None),
        ("pump_failure:cdu-1/pump1@20m+15m", "pump_failure", "cdu-1/pump1", 1200.0, 900.0, None),
        ("phase_overload:pdu-a01-a/L1@30m", "phase_overload", "pdu-a01-a/L1", 1800.0, None, None),
        ("fleet_idle:infer-chat@1h", "fleet_idle", "infer-chat", 3600.0, None, None),
        ("fleet_idle:infer-chat@600", "fleet_idle", "infer-chat", 600.0, None, None),
        ("fleet_idle:infer-chat@600s+90s", "fleet_idle", "infer-chat", 600.0, 90.0, None),
        ("cold_plate:n@x:1@1.5h+1d=0.5", "cold_plate", "n@x:1", 5400.0, 86400.0, 0.5),
    ],
)
def test_parse_fault(
    spec: str, kind: str, target: str, start: float, duration: float | None, magnitude: float | None
) -> None:
    f = parse_fault(spec)
    assert (f.kind, f.target, f.start_s, f.duration_s, f.magnitude) == (
        kind,
        target,
        start,
        duration,
        magnitude,
    )
    assert parse_fault(str(f)) == f


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("cold_plate", "no ':' after the kind"),
        ("overheat:gpu:1@10m", "unknown kind 'overheat'"),
        ("pump_failure:cdu-1/pump1", "no '@START'"),
        ("pump_failure:@10m", "empty target"),
        ("pump_failure:cdu-1/pump1@soon", "start 'soon'"),
        ("pump_failure:cdu-1/pump1@10m+forever", "duration 'forever'"),
        ("pump_failure:cdu-1/pump1@10m+0", "duration must be positive"),
        ("phase_overload:pdu/L1@1m=lots", "magnitude 'lots'"),
    ],
)
def test_parse_fault_errors(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        parse_fault(spec)


def test_fault_window() -> None:
    f = Fault(kind="fleet_idle", target="x", start_s=10, duration_s=5)
    assert [f.active(t) for t in (9.9, 10.0, 14.9, 15.0)] == [False, True, True, False]
    assert Fault(kind="fleet_idle", target="x", start_s=10).active(1e9)


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("cold_plate:trn-a01-n1:9@1m", "'trn-a01-n1:9'"),
        ("pump_failure:cdu-1/pump3@1m", "'cdu-1/pump3'"),
        ("pump_failure:cdu-9/pump1@1m", "'cdu-9/pump1'"),
        ("phase_overload:pdu-zz/L1@1m", "'pdu-zz'"),
        ("phase_overload:pdu-a01-a/L4@1m", "'L4'"),
        ("fleet_idle:nobody@1m", "'nobody'"),
        ("fleet_idle:infer-chat@1m=2", "must be in 0..1"),
    ],
)
def test_unknown_fault_targets_are_named(site: Site, spec: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        make(site, [spec])


# ---- determinism and the contract --------------------------------------------------------------


def test_same_seed_same_bytes_different_seed_different(site: Site) -> None:
    faults = [
        "cold_plate:trn-a01-n1:3@5",
        "pump_failure:cdu-1/pump2@10+10",
        "fleet_idle:infer-chat@20",
    ]
    a, b, c = make(site, faults), make(site, faults), make(site, faults, seed=SEED + 1)
    out_a = [a.step() for _ in range(40)]
    out_b = [b.step() for _ in range(40)]
    out_c = [c.step() for _ in range(40)]
    assert out_a == out_b
    assert out_a != out_c
    assert a.truth() == b.truth() != c.truth()


def test_every_message_decodes_with_the_contract(site: Site) -> None:
    sim = make(site, rate_hz=2.0)
    assert sim.sim_time == START
    seen_samples: Counter[str] = Counter()
    seen_messages: Counter[str] = Counter()
    sources: dict[str, set[str]] = {}
    last_seq: dict[str, int] = {}
    for k in range(10):
        msgs = sim.step()
        assert sim.sim_time == START + timedelta(seconds=0.5 * k)
        assert sim.sim_time.tzinfo is not None
        for topic, payload in msgs:
            site_name, kind, source = parse_topic(topic)
            assert site_name == "small"
            m = decode(topic, payload)  # raises ContractError on any violation
            assert m.collector == "sim"
            assert m.ts == sim.sim_time
            assert m.seq == last_seq.get(topic, -1) + 1
            last_seq[topic] = m.seq
            sources.setdefault(kind, set()).add(source)
            seen_messages[kind] += 1
            seen_samples[kind] += len(m.samples)
            raw = json.loads(payload)
            for s in raw["samples"]:
                assert site.is_known(kind, s["id"]), (kind, s["id"])
                for q, v in s.items():
                    if q == "id":
                        continue
                    assert q in QUANTITIES[kind], (kind, q)
                    assert type(v) is (int if QUANTITIES[kind][q].integer else float), (kind, q, v)
    assert dict(seen_samples) == sim.published
    assert dict(seen_messages) == sim.messages
    assert sources == {
        "gpu": {"trn-a01-n1", "inf-a01-n2", "trn-a02-n1"},
        "node": {"trn-a01-n1", "inf-a01-n2", "trn-a02-n1"},
        "pdu": {"pdu-a01-a", "pdu-a01-b", "pdu-a02-a", "pdu-a02-b"},
        "cdu": {"cdu-1"},
        "link": {"leaf-a01", "leaf-a02"},
    }
    # one sample per GPU per tick; every PDU phase and breaker; both pumps; every link
    assert sim.published["gpu"] == 10 * 24
    assert sim.published["pdu"] == 10 * 4 * (1 + 3 + 3)
    assert sim.published["cdu"] == 10 * 3
    assert sim.published["link"] == 10 * 5


def test_truth_is_json_and_complete(site: Site) -> None:
    sim = make(site, ["cold_plate:trn-a01-n1:3@1m"])
    truth = json.loads(json.dumps(sim.truth()))
    assert truth["seed"] == SEED and truth["rate_hz"] == 1.0
    assert truth["start"] == "2026-11-29T02:00:00Z"
    assert len(truth["gpus"]) == 24
    g = truth["gpus"]["trn-a01-n1:0"]
    assert g["coolant"] == "liquid" and g["cdu"] == "cdu-1"
    for key in (
        "idle_w",
        "limit_w",
        "gamma",
        "r_k_per_w",
        "c_j_per_k",
        "mem_r_k_per_w",
        "mem_c_j_per_k",
    ):
        assert g[key] > 0
    assert 0.8 <= g["gamma"] <= 1.0
    assert 0.03 * 0.85 <= g["r_k_per_w"] <= 0.03 * 1.15
    assert truth["gpus"]["trn-a02-n1:0"]["coolant"] == "air"
    assert 0.07 * 0.85 <= truth["gpus"]["trn-a02-n1:0"]["r_k_per_w"] <= 0.07 * 1.15
    assert abs(truth["racks"]["rack-a01"]["capture_fraction"] - 0.75) <= 0.03 + 1e-9
    assert truth["racks"]["rack-a02"]["capture_fraction"] == 0.0
    assert set(truth["cdus"]["cdu-1"]["pumps"]) == {"pump1", "pump2"}
    assert set(truth["pdus"]) == {"pdu-a01-a", "pdu-a01-b", "pdu-a02-a", "pdu-a02-b"}
    assert set(truth["links"]) == {link["name"] for link in SMALL_SITE["links"]}
    (fault,) = truth["faults"]
    r = g = truth["gpus"]["trn-a01-n1:3"]["r_k_per_w"]
    assert fault["effective_magnitude"] * r == pytest.approx(0.1, rel=1e-4)


# ---- physics -----------------------------------------------------------------------------------


def test_liquid_gpu_converges_to_supply_plus_r_times_power(site: Site) -> None:
    # the training fleet idles for 60 s, then its load steps up; after 10 tau the temperature
    # sits at T_supply + offset + R P (means over a window: the RC model is linear)
    sim = make(site, ["fleet_idle:train-llm@0+60"])
    rows = collect(sim, 240)
    truth = sim.truth()["gpus"]
    supply = series(rows, "cdu", "cdu-1", "supply_temp_c")
    for i in range(8):
        gid = f"trn-a01-n1:{i}"
        t = truth[gid]
        a = series(rows, "gpu", gid, "sm_active")
        assert a[:60].max() < 0.1 and a[61:].min() > 0.5  # a clean step, no checkpoint dip
        temp = series(rows, "gpu", gid, "temp_c")
        power = series(rows, "gpu", gid, "power_w")
        lo = 60 + int(10 * t["tau_s"]) + 1
        expected = supply[lo:].mean() + t["coolant_offset_k"] + t["r_k_per_w"] * power[lo:].mean()
        assert temp[lo:].mean() == pytest.approx(expected, abs=0.3)
        assert temp[62] < expected - 5  # not there yet right after the step
        mem = series(rows, "gpu", gid, "mem_temp_c")
        mem_expected = (
            supply[lo:].mean() + t["coolant_offset_k"] + t["mem_r_k_per_w"] * power[lo:].mean()
        )
        assert mem[lo + 60 :].mean() == pytest.approx(mem_expected, abs=0.4)


def test_air_gpu_sits_at_inlet_plus_r_times_power(baseline: tuple[SiteSimulator, Rows]) -> None:
    sim, rows = baseline
    truth = sim.truth()["gpus"]
    inlet = series(rows, "node", "trn-a02-n1", "inlet_temp_c", 100)
    for i in range(8):
        gid = f"trn-a02-n1:{i}"
        temp = series(rows, "gpu", gid, "temp_c", 100)
        power = series(rows, "gpu", gid, "power_w", 100)
        expected = inlet.mean() + truth[gid]["r_k_per_w"] * power.mean()
        assert temp.mean() == pytest.approx(expected, abs=0.6)


def test_power_chain_and_cdu_heat_balance(baseline: tuple[SiteSimulator, Rows]) -> None:
    sim, rows = baseline
    truth = sim.truth()
    lo = 150  # past the loop lag
    node_power: dict[str, np.ndarray] = {}
    for node, spec in truth["nodes"].items():
        gpu_sum = sum(series(rows, "gpu", f"{node}:{i}", "power_w", lo) for i in range(8))
        dc = electrical.node_power_w(gpu_sum, spec["base_w"], spec["overhead_frac"])
        modeled = electrical.psu_input_w(dc, spec["psu_loss_const_w"], spec["psu_efficiency"])
        node_power[node] = series(rows, "node", node, "power_w", lo)
        assert node_power[node].mean() == pytest.approx(modeled.mean(), rel=0.005)
    # PDUs carry the rack: A + B = sum of node input power
    rack1 = node_power["trn-a01-n1"] + node_power["inf-a01-n2"]
    pdus = series(rows, "pdu", "pdu-a01-a", "power_w", lo) + series(
        rows, "pdu", "pdu-a01-b", "power_w", lo
    )
    assert pdus.mean() == pytest.approx(rack1.mean(), rel=0.005)
    # CDU heat = capture fraction x rack power (rack-a02 is air-cooled)
    heat = series(rows, "cdu", "cdu-1", "heat_kw", lo)
    capture = truth["racks"]["rack-a01"]["capture_fraction"]
    assert heat.mean() == pytest.approx(capture * rack1.mean() / 1000.0, rel=0.02)
    # heat balance on the reported CDU quantities: rho V cp dT, with return above supply
    supply = series(rows, "cdu", "cdu-1", "supply_temp_c", lo)
    ret = series(rows, "cdu", "cdu-1", "return_temp_c", lo)
    assert 2.0 < (ret - supply).mean() < 12.0
    flow = series(rows, "cdu", "cdu-1", "flow_lpm", lo)
    assert flow.mean() == pytest.approx(0.8 * 30.0, rel=0.05)  # both pumps at 80 %
    # PDU phases: wye phase current = phase power / (V_LN PF)
    s = rows[-1][("pdu", "pdu-a01-a/L1")]
    assert s["current_a"] == pytest.approx(
        s["power_w"] / (s["voltage_v"] * s["power_factor"]), rel=0.02
    )


def test_link_traffic_follows_the_allreduce(baseline: tuple[SiteSimulator, Rows]) -> None:
    sim, rows = baseline
    truth = sim.truth()
    (job,) = truth["fleets"]["train-llm"]["groups"]
    group = truth["groups"][job]
    # one job on the two training nodes: each sends 2(n-1)/n S = S per step, scaled by
    # activity / level
    assert group["nodes"] == ["trn-a01-n1", "trn-a02-n1"]
    assert group["allreduce_bytes_per_node"] == truth["fleets"]["train-llm"]["gradient_bytes"]
    assert group["allreduce_bytes_per_node"] == 16e9
    act = np.mean([series(rows, "gpu", f"trn-a01-n1:{i}", "sm_active") for i in range(8)], axis=0)
    expected = 8 * 16e9 / group["step_s"] * np.clip(act / group["level"], 0, 1.2)
    tx = series(rows, "link", "trn-a01-n1-up", "tx_bps")
    assert tx.mean() == pytest.approx(expected.mean(), rel=0.01)
    # its peer is under the other leaf: all of it crosses the spine, with the inference traffic
    up = series(rows, "link", "leaf-a01-spine-1", "tx_bps")
    inf = series(rows, "link", "inf-a01-n2-up", "tx_bps")
    assert up.mean() == pytest.approx((tx + inf).mean(), rel=0.01)
    assert (up < 800e9).all()


# ---- faults ------------------------------------------------------------------------------------


# ---- workload ----------------------------------------------------------------------------------


def _runs_below(a: np.ndarray, level: float) -> list[int]:
    """Lengths of the runs of consecutive samples below ``level``."""
    runs, n = [], 0
    for below in a < level:
        if below:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    return [*runs, n] if n else runs


@pytest.mark.slow  # 3 s or more: out of the fast tier
def test_every_group_is_interrupted_within_two_hours(site: Site) -> None:
    # a training job ends within 90 min: 2-8 min idle, then a 2-5 min warm-up; an inference
    # replica group is recycled within 100 min: 1-3 min drained, then 1-2 min loading
    sim = make(site, seed=5)
    rows = collect(sim, 7200)
    truth = sim.truth()
    assert set(truth["groups"]) == {"train-llm/job0", "infer-chat/rack-a01"}
    for gid, gap in (("trn-a01-n1:0", 120), ("trn-a02-n1:4", 120), ("inf-a01-n2:2", 60)):
        a = series(rows, "gpu", gid, "sm_active")
        idle_runs = [n for n in _runs_below(a, 0.06) if n >= gap - 5]
        assert idle_runs, (gid, _runs_below(a, 0.06))
        if gid.startswith("trn"):  # a warm-up passes through the middle (dips jump over it)
            assert ((a > 0.25) & (a < 0.6)).sum() >= 30, gid
    # both nodes of the one training job stop together
    a1 = series(rows, "gpu", "trn-a01-n1:0", "sm_active")
    a2 = series(rows, "gpu", "trn-a02-n1:0", "sm_active")
    assert np.corrcoef(a1 < 0.06, a2 < 0.06)[0, 1] > 0.9


def test_inference_load_drops_at_the_weekend(site: Site) -> None:
    # same seed, same hour: a Wednesday and a Saturday; the random stream is the same, so the
    # inference activity differs by the fleet's weekend factor
    def mean_activity(start: datetime) -> tuple[float, float]:
        sim = SiteSimulator(site, seed=SEED, start=start, rate_hz=0.1)  # 10 min at 10 s
        rows = collect(sim, 60)
        a = np.mean([series(rows, "gpu", f"inf-a01-n2:{i}", "sm_active") for i in range(8)])
        return float(a), sim.truth()["fleets"]["infer-chat"]["weekend_factor"]

    weekday, factor = mean_activity(datetime(2026, 12, 2, 14, 0, tzinfo=UTC))
    saturday, _ = mean_activity(datetime(2026, 12, 5, 14, 0, tzinfo=UTC))
    assert 0.6 <= factor <= 0.8
    assert saturday / weekday == pytest.approx(factor, rel=0.05)


def test_cold_plate_raises_gpu_temperature_by_delta_r_times_power(
    site: Site, baseline: tuple[SiteSimulator, Rows]
) -> None:
    _, base = baseline
    sim, rows = run_with(site, "cold_plate:inf-a01-n2:3@60")
    fault = sim.truth()["faults"][0]
    gid = "inf-a01-n2:3"
    r = sim.truth()["gpus"][gid]["r_k_per_w"]
    delta_r = fault["effective_magnitude"] * r
    assert delta_r == pytest.approx(0.1, rel=1e-4)
    before = series(rows, "gpu", gid, "temp_c", 0, 60) - series(base, "gpu", gid, "temp_c", 0, 60)
    assert np.abs(before).max() == 0.0
    lo = 150  # 2 tau of the degraded plate after the start
    rise = series(rows, "gpu", gid, "temp_c", lo) - series(base, "gpu", gid, "temp_c", lo)
    power = series(rows, "gpu", gid, "power_w", lo)
    assert rise.mean() == pytest.approx(delta_r * power.mean(), rel=0.15)
    # against its peers in the same node
    peers = [f"inf-a01-n2:{i}" for i in range(8) if i != 3]
    gap_after = series(rows, "gpu", gid, "temp_c", lo) - np.mean(
        [series(rows, "gpu", p, "temp_c", lo) for p in peers], axis=0
    )
    gap_before = series(rows, "gpu", gid, "temp_c", 0, 60) - np.mean(
        [series(rows, "gpu", p, "temp_c", 0, 60) for p in peers], axis=0
    )
    assert gap_after.mean() - gap_before.mean() > 0.7 * delta_r * power.mean()


def test_cold_plate_on_a_busy_gpu_throttles_it(site: Site) -> None:
    _, rows = run_with(site, "cold_plate:trn-a01-n1:3@60")
    gid = "trn-a01-n1:3"
    temp = series(rows, "gpu", gid, "temp_c", 200)
    assert temp.mean() == pytest.approx(87.0, abs=1.0)  # held at max operating temperature
    thr = [r[("gpu", gid)]["throttle_reasons"] for r in rows[200:]]
    assert all(t & 0x20 for t in thr)
    assert all(r[("gpu", gid)]["throttle_reasons"] & 0x20 == 0 for r in rows[:60])
    assert series(rows, "gpu", gid, "clock_sm_mhz", 200).max() < 1980.0
    peer = series(rows, "gpu", "trn-a01-n1:2", "power_w", 200)
    assert series(rows, "gpu", gid, "power_w", 200).mean() < 0.85 * peer.mean()


def test_pump_failure_lowers_flow_and_raises_return(
    site: Site, baseline: tuple[SiteSimulator, Rows]
) -> None:
    _, base = baseline
    _, rows = run_with(site, "pump_failure:cdu-1/pump1@60")
    flow_b = series(base, "cdu", "cdu-1", "flow_lpm", 100)
    flow_f = series(rows, "cdu", "cdu-1", "flow_lpm", 100)
    assert 0.5 * flow_b.mean() < flow_f.mean() < 0.9 * flow_b.mean()
    ret_b = series(base, "cdu", "cdu-1", "return_temp_c", 200)
    ret_f = series(rows, "cdu", "cdu-1", "return_temp_c", 200)
    assert ret_f.mean() > ret_b.mean() + 0.5
    assert series(rows, "cdu", "cdu-1/pump1", "pump_speed_pct", 61).max() == 0.0
    assert series(rows, "cdu", "cdu-1/pump1", "pump_power_w", 61).max() == 0.0
    assert series(rows, "cdu", "cdu-1/pump2", "pump_speed_pct", 61).min() == 80.0
    # the heat meter still closes once the loop settles
    heat_b = series(base, "cdu", "cdu-1", "heat_kw", 200)
    heat_f = series(rows, "cdu", "cdu-1", "heat_kw", 200)
    assert heat_f.mean() == pytest.approx(heat_b.mean(), rel=0.03)
    # less flow through the cold plates: R rises by its convective half, (flow ratio)^-0.8
    truth = make(site).truth()["gpus"]["trn-a01-n1:0"]
    ratio = flow_f.mean() / flow_b.mean()
    rise = truth["r_k_per_w"] * 0.5 * (ratio**-0.8 - 1.0)
    p_gpu = series(rows, "gpu", "trn-a01-n1:0", "power_w", 200).mean()
    t_b = series(base, "gpu", "trn-a01-n1:0", "temp_c", 200).mean()
    t_f = series(rows, "gpu", "trn-a01-n1:0", "temp_c", 200).mean()
    p_b = series(base, "gpu", "trn-a01-n1:0", "power_w", 200).mean()
    expected = rise * p_gpu + truth["r_k_per_w"] * (p_gpu - p_b)
    assert t_f - t_b == pytest.approx(expected, abs=0.5)
    assert t_f - t_b > 2.0


def test_phase_overload_takes_the_phase_toward_its_rating(
    site: Site, baseline: tuple[SiteSimulator, Rows]
) -> None:
    _, base = baseline
    sim, rows = run_with(site, "phase_overload:pdu-a01-a/L1@60", "phase_overload:pdu-a02-b/L2@60")
    wye = series(rows, "pdu", "pdu-a01-a/L1", "current_a")
    assert wye[:60].mean() < 0.7 * 32
    assert wye[61:].mean() == pytest.approx(0.95 * 32, rel=0.02)
    assert series(rows, "pdu", "pdu-a01-a/br1", "current_a", 61).mean() == pytest.approx(
        0.95 * 32, rel=0.02
    )
    # other phases and PDUs untouched
    np.testing.assert_array_equal(
        series(rows, "pdu", "pdu-a01-a/L2", "current_a"),
        series(base, "pdu", "pdu-a01-a/L2", "current_a"),
    )
    delta = series(rows, "pdu", "pdu-a02-b/L2", "current_a")
    assert delta[:60].mean() < 0.8 * 30
    assert delta[61:].mean() == pytest.approx(0.95 * 30, rel=0.02)
    assert series(rows, "pdu", "pdu-a02-b/br2", "current_a", 61).mean() > 5.0  # L2-L3 branch
    for f in sim.truth()["faults"]:
        assert f["effective_magnitude"] > 0


def test_phase_creep_ramps_the_phase_to_its_target(site: Site) -> None:
    sim, rows = run_with(site, "phase_creep:pdu-a01-a/L1@60+200")
    cur = series(rows, "pdu", "pdu-a01-a/L1", "current_a")
    (fault,) = sim.truth()["faults"]
    assert fault["effective_magnitude"] > 0
    # linear from the start to the end of the ramp, then at 95 % of the rating, and it stays
    assert cur[:60].mean() < 0.7 * 32
    assert cur[100] < cur[140] < cur[200] < 0.95 * 32 * 0.99
    assert cur[262:].mean() == pytest.approx(0.95 * 32, rel=0.02)
    mid = cur[160] - cur[59]
    assert mid == pytest.approx(0.5 * (cur[262:].mean() - cur[:60].mean()), rel=0.15)


def test_fleet_idle_drops_the_fleet_power(site: Site, baseline: tuple[SiteSimulator, Rows]) -> None:
    sim, base = baseline
    _, rows = run_with(site, "fleet_idle:train-llm@60+120")
    truth = sim.truth()["gpus"]
    for node in ("trn-a01-n1", "trn-a02-n1"):
        for i in range(8):
            gid = f"{node}:{i}"
            p_idle = series(rows, "gpu", gid, "power_w", 65, 180)
            # activity 0.03 with gamma 0.8..1 puts power 2-6 % of the range above idle
            assert p_idle.mean() < 1.6 * truth[gid]["idle_w"]
            assert series(rows, "gpu", gid, "sm_active", 65, 180).mean() < 0.05
            assert series(base, "gpu", gid, "power_w", 65, 180).mean() > 3 * p_idle.mean()
            # back to work after the fault window
            assert series(rows, "gpu", gid, "sm_active", 181).mean() > 0.5
    # the inference fleet is not affected
    np.testing.assert_array_equal(
        series(rows, "gpu", "inf-a01-n2:0", "sm_active"),
        series(base, "gpu", "inf-a01-n2:0", "sm_active"),
    )


def test_mixed_site_covers_every_wiring_and_coolant() -> None:
    # water and PG25 loops, a catalog CDU, a single-phase PDU, 4-GPU trays, explicit phases, a
    # node in no fleet, a spine-spine link: every message still passes the contract
    site = Site.model_validate(
        {
            "name": "mixed",
            "halls": [
                {
                    "name": "h",
                    "rows": [
                        {
                            "name": "r",
                            "racks": [
                                {
                                    "name": "nvl-1",
                                    "grid": [0, 0],
                                    "pdus": ["p-1"],
                                    "cdu": "cdu-w",
                                    "nodes": [
                                        {
                                            "name": f"tray-{i}",
                                            "model": "GB200-NVL72-TRAY",
                                            "phase": "L3",
                                        }
                                        for i in range(3)
                                    ],
                                },
                                {
                                    "name": "b200-1",
                                    "grid": [1, 0],
                                    "pdus": ["p-2", "p-3"],
                                    "cdu": "cdu-g",
                                    "capture_fraction": 0.8,
                                    "nodes": [{"name": "b200-n1", "model": "DGX-B200"}],
                                },
                            ],
                        }
                    ],
                }
            ],
            "pdus": [
                {
                    "name": "p-1",
                    "feed": "A",
                    "phases": 1,
                    "voltage_v": 230,
                    "rated_current_a": 80,
                    "breakers": [{"name": "b1", "phase": "L1", "rated_current_a": 80}],
                },
                {
                    "name": "p-2",
                    "feed": "A",
                    "wiring": "delta",
                    "voltage_v": 208,
                    "rated_current_a": 60,
                    "breakers": [{"name": "b1", "phase": "L1", "rated_current_a": 60}],
                },
                {
                    "name": "p-3",
                    "feed": "B",
                    "voltage_v": 400,
                    "rated_current_a": 63,
                    "breakers": [{"name": "b1", "phase": "L1-L2", "rated_current_a": 63}],
                },
            ],
            "cdus": [
                {
                    "name": "cdu-w",
                    "model": "INRACK-CDU-200",
                    "coolant": "water",
                    "pumps": ["p1", "p2", "p3"],
                },
                {
                    "name": "cdu-g",
                    "capacity_kw": 50,
                    "approach_k": 3,
                    "max_flow_lpm": 60,
                    "pumps": ["p1"],
                    "fw_supply_temp_c": 32,
                },
            ],
            "switches": [{"name": "s1", "role": "spine"}, {"name": "s2", "role": "spine"}],
            "links": [{"name": "s1-s2", "a": "s1", "b": "s2", "capacity_gbps": 800}],
            "fleets": [{"name": "t", "role": "training", "members": ["tray-0", "tray-1"]}],
        }
    )
    sim = SiteSimulator(
        site,
        seed=1,
        start=START,
        faults=[parse_fault("pump_failure:cdu-g/p1@2"), parse_fault("phase_overload:p-1/L1@1")],
    )
    kinds: Counter[str] = Counter()
    for _ in range(5):
        for topic, payload in sim.step():
            m = decode(topic, payload)
            kinds[m.kind] += len(m.samples)
            for s in m.samples:
                assert site.is_known(m.kind, s["id"]), s["id"]
    assert dict(kinds) == sim.published
    assert sim.published["gpu"] == 5 * (3 * 4 + 8)
    assert sim.published["pdu"] == 5 * ((1 + 1 + 1) + (1 + 3 + 1) + (1 + 3 + 1))
    truth = sim.truth()
    # fw 32 °C + approach 3 K is above the 32 °C setpoint: the supply floats
    assert truth["cdus"]["cdu-g"]["approach_k"] == pytest.approx(3.0, rel=0.1)
    last = {(m.kind, s["id"]): s for m in (decode(t, p) for t, p in sim.step()) for s in m.samples}
    assert last[("cdu", "cdu-g")]["supply_temp_c"] > 33.5
    assert last[("cdu", "cdu-g")]["flow_lpm"] == 0.0  # its only pump failed
    assert last[("cdu", "cdu-g")]["heat_kw"] == 0.0
    rise = last[("cdu", "cdu-g")]["return_temp_c"] - last[("cdu", "cdu-g")]["supply_temp_c"]
    assert 0.0 < rise < 40.5
    assert last[("cdu", "cdu-w")]["flow_lpm"] > 0.0
    assert last[("pdu", "p-1/L1")]["current_a"] == pytest.approx(0.95 * 80, rel=0.02)
    assert last[("pdu", "p-3/b1")]["current_a"] == 0.0  # line-to-line breaker on a wye PDU
    assert last[("link", "s1-s2")]["tx_bps"] > 0.0
    assert truth["gpus"]["tray-0:0"]["coolant"] == "liquid"
    assert truth["nodes"]["tray-2"]["fleet"] is None
    assert truth["nodes"]["tray-1"]["phase"] == "L3"


def test_faults_added_to_a_copy_continue_exactly_as_a_run_that_had_them(site: Site) -> None:
    import copy

    faults = [
        "cold_plate:trn-a01-n1:3@50s",  # default magnitude, set when added
        "pump_failure:cdu-1/pump1@55s+20s",
        "phase_overload:pdu-a01-a/L1@52s",
        "fleet_idle:infer-chat@58s",
    ]
    whole = make(site, faults)
    before = collect(whole, 40)
    healthy = make(site)
    assert collect(healthy, 40) == before  # faults draw nothing before they begin
    later = copy.deepcopy(healthy)
    later.add_faults([parse_fault(f) for f in faults])
    after = collect(whole, 60)
    assert collect(later, 60) == after
    assert after != collect(healthy, 60)  # the faults did change the run
    with pytest.raises(ValueError, match="unknown GPU"):
        later.add_faults([parse_fault("cold_plate:nope:0@0")])
