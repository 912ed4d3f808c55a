"""A physics-consistent simulator of a whole site, driven by the site model.

Every equation comes from :mod:`models` (none is re-implemented here); this module only wires
them together over the site's topology, draws per-device parameters around the catalog
defaults (the *truth* a calibrator should recover), generates workload, injects faults and
builds contract messages. All per-device state lives in numpy arrays, so one tick of a
10,000-GPU site costs a few milliseconds of physics; building and encoding the JSON messages
is the larger part.

Time: tick ``k`` is at ``start + k / rate_hz``. Inputs (power, coolant temperature) are held
over each tick (zero-order hold), so a GPU's temperature at tick ``k`` is
``models.gpu_thermal.rc_step`` of tick ``k - 1``'s temperature, coolant and power; the first
tick starts from steady state. See README.md for every field, its unit and the truth format.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from numpy.typing import NDArray

from collectors.contract import (
    KINDS,
    encode,
    phase_id,
    phase_ids,
    phase_leg,
    split_sub_id,
    sub_id,
    topic_for,
)
from models import cdu as cdu_model
from models import coolant, electrical, gpu_power, gpu_thermal, network
from twin.simulator.faults import Fault
from twin.site.catalog import ASSUMPTIONS, CDU_MODELS
from twin.site.index import index_site
from twin.site.model import Pdu, Site

__all__ = ["SiteSimulator"]

F64 = NDArray[np.float64]

COLLECTOR = "sim"

# NVML clock-event reasons (nvmlClocksEventReason*).
THROTTLE_SW_POWER_CAP = 0x4
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40

# ---- workload ---------------------------------------------------------------------------------
# Work runs in groups: a training job is up to TRAIN_JOB_NODES consecutive nodes of a training
# fleet (in site order); an inference replica group is the nodes of one fleet in one rack. Each
# group is interrupted now and then (a job ends and the next one starts after a gap and a
# warm-up; a replica group is recycled by a rolling deploy or the autoscaler), independently of
# the others, so racks on one CDU do not carry proportional loads.
IDLE_ACTIVITY = 0.02  # nodes in no fleet, and groups between runs
FLEET_IDLE_ACTIVITY = 0.03  # default of the fleet_idle fault
TRAIN_JOB_NODES = 4  # nodes per training job (32 GPUs on 8-GPU nodes)
TRAIN_LEVEL = (0.85, 0.95)  # per-job SM activity while training
TRAIN_GPU_SPREAD = 0.02  # per-GPU relative offset around the job level (±)
TRAIN_NOISE = 0.01  # per-tick white noise on SM activity
TRAIN_RUN_S = (30 * 60.0, 90 * 60.0)  # a job runs 30-90 min ...
TRAIN_GAP_S = (120.0, 480.0)  # ... the next starts 2-8 min later ...
TRAIN_RAMP_S = (120.0, 300.0)  # ... and warms up (data loading, compilation) for 2-5 min
CHECKPOINT_PERIOD_S = 1800.0  # from the end of the warm-up
CHECKPOINT_DURATION_S = 60.0
CHECKPOINT_ACTIVITY = 0.1
INFER_BASE = (0.10, 0.20)  # inference night-time floor
INFER_AMPLITUDE = (0.40, 0.60)  # inference daily swing above the floor
INFER_PEAK_HOUR_UTC = (13.0, 15.0)
INFER_WEEKEND = (0.6, 0.8)  # Saturday and Sunday (UTC) load relative to weekdays
INFER_GROUP_SHARE = (0.8, 1.2)  # a replica group's share of its fleet's load (load balancer)
INFER_GROUP_NOISE = 0.15  # relative AR(1) noise of a group's load ...
INFER_GROUP_TAU_S = 300.0  # ... with this correlation time
INFER_RUN_S = (45 * 60.0, 100 * 60.0)  # a replica group serves 45-100 min ...
INFER_GAP_S = (60.0, 180.0)  # ... is drained for 1-3 min ...
INFER_RAMP_S = (60.0, 120.0)  # ... and takes 1-2 min to load the model and fill its batches
INFER_GPU_SHARE = (0.9, 1.1)  # per-GPU share of the group's load
INFER_NOISE = 0.04  # per-GPU AR(1) noise, correlation time INFER_NOISE_TAU_S
INFER_NOISE_TAU_S = 20.0
IDLE_NOISE = 0.003
# ---- GPUs -------------------------------------------------------------------------------------
IDLE_SPREAD = 0.05  # idle_w ±5 %
GAMMA_RANGE = (0.8, 1.0)
R_SPREAD = 0.15  # R ±15 %
TAU_SPREAD = 0.20  # tau ±20 %
MEM_R_FACTOR = 1.1  # HBM R ≈ 1.1 × core R (±5 %)
MEM_TAU_FACTOR = 1.5  # HBM tau ≈ 1.5 × core tau
COOLANT_OFFSET_K = (0.0, 0.5)  # local coolant above TCS supply (position along the loop)
THERMAL_MIN_FRACTION = 0.3  # lowest share of dynamic power the thermal slowdown leaves
THERMAL_RELEASE_K = 3.0  # slowdown ends this far below max operating temperature
POWER_NOISE = 0.01  # relative, board power reading
TEMP_NOISE_K = 0.3
# ---- nodes, racks, PDUs -----------------------------------------------------------------------
NODE_BASE_SPREAD = 0.05
NODE_OVERHEAD_SPREAD = 0.10
# PSU losses, pump speed and the default design dP are the twin's assumptions (the catalog's,
# docs/physics.md §4.2, §3.6), so the chain assumes what the simulated site does
PSU_LOSS_CONST_W = ASSUMPTIONS.psu_loss_const_w
PSU_EFFICIENCY = ASSUMPTIONS.psu_efficiency
NODE_POWER_NOISE = 0.005
CAPTURE_SPREAD = 0.03
RACK_INLET_C = (22.0, 25.0)
RACK_INLET_SWING_K = (0.2, 0.6)  # daily swing amplitude, warmest at 15:00 UTC
RACK_HUMIDITY_PCT = (35.0, 50.0)
PDU_POWER_FACTOR = (0.97, 0.99)
PHASE_OVERLOAD_TARGET = 0.95  # default phase_overload: phase current to 95 % of the rating
# ---- CDUs -------------------------------------------------------------------------------------
APPROACH_SPREAD = 0.10
PUMP_SPEED = ASSUMPTIONS.pump_speed_frac
PUMP_CURVE_SPREAD = 0.03
PUMP_EFFICIENCY = 0.5
DEFAULT_DESIGN_DP_KPA = ASSUMPTIONS.design_dp_kpa  # when a CDU names no catalog model
LOOP_TAU_S = 30.0  # return temperature lag, ±20 %
FW_DRIFT_K = (0.2, 0.5)  # facility water supply drift amplitude ...
FW_DRIFT_PERIOD_S = (4 * 3600.0, 8 * 3600.0)  # ... and period
FW_FLOW_SPREAD = 0.10  # facility water flow ≈ TCS max flow ±10 %
MIN_FLOW_LPM = 1.0  # flow floor in the heat balance when every pump is down ...
MAX_LOOP_RISE_K = 40.0  # ... and the most the return can rise above the supply (stagnant loop)
CDU_TEMP_NOISE_K = 0.05
CDU_FLOW_NOISE = 0.005
# ---- links ------------------------------------------------------------------------------------
TRAIN_PARAMS = 8e9  # parameters of the model each training fleet trains (data parallel)
GRAD_BYTES = 2  # bf16 gradients
TRAIN_STEP_S = (3.0, 6.0)
INFER_NODE_BPS = 2e9  # inference traffic per node at activity 1
IDLE_NODE_BPS = 5e6
LINK_BACKGROUND_BPS = (1e6, 1e7)
LINK_NOISE = 0.02
LINK_ERROR_PROB = 1e-4  # per link per tick


def _uniform(rng: np.random.Generator, lo_hi: tuple[float, float], n: int) -> F64:
    return rng.uniform(lo_hi[0], lo_hi[1], n)


def _spread(rng: np.random.Generator, rel: float, n: int) -> F64:
    """Multipliers 1 ± rel, uniform."""
    return 1.0 + rng.uniform(-rel, rel, n)


class SiteSimulator:
    """Simulate every GPU, node, PDU, CDU and link of ``site`` and emit contract messages.

    Parameters
    ----------
    site : twin.site.Site
        The site model.
    seed : int
        Seed of the one numpy Generator; same seed, start, rate and faults give byte-identical
        messages.
    start : datetime
        Aware timestamp of the first tick (converted to UTC).
    rate_hz : float
        Ticks per simulated second; ``dt_s = 1 / rate_hz``.
    faults : sequence of Fault
        Faults to inject; targets are checked against the site (ValueError naming them).
    """

    def __init__(
        self,
        site: Site,
        *,
        seed: int = 0,
        start: datetime,
        rate_hz: float = 1.0,
        faults: Sequence[Fault] = (),
    ) -> None:
        if start.tzinfo is None:
            raise ValueError("start must be timezone-aware (UTC)")
        if not (math.isfinite(rate_hz) and rate_hz > 0):
            raise ValueError(f"rate_hz must be a positive number, got {rate_hz!r}")
        self.site = site
        self.seed = int(seed)
        self.start = start.astimezone(UTC)
        self.rate_hz = float(rate_hz)
        self.dt_s = 1.0 / self.rate_hz
        # Below 1 Hz a reading stands for the mean of the 1 Hz readings over its interval, so
        # measurement noise falls as 1/sqrt(dt); workload processes are not measurement noise.
        self._meas = 1.0 / math.sqrt(max(self.dt_s, 1.0))
        self.faults: tuple[Fault, ...] = tuple(faults)
        self.published: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.messages: dict[str, int] = dict.fromkeys(KINDS, 0)
        self._tick = -1
        self._seq: dict[str, int] = {}
        self._rng = np.random.default_rng(self.seed)
        self._build_topology()
        self._resolve_faults()
        self._draw_parameters()
        self._build_message_layout()

    # ---- public ----------------------------------------------------------------------------

    @property
    def tick(self) -> int:
        """Index of the latest tick (-1 before the first :meth:`step`)."""
        return self._tick

    @property
    def elapsed_s(self) -> float:
        """Simulated seconds from the start to the latest tick."""
        return max(self._tick, 0) * self.dt_s

    @property
    def sim_time(self) -> datetime:
        """Aware UTC time of the latest tick (``start`` before the first :meth:`step`)."""
        return self.start + timedelta(seconds=self.elapsed_s)

    def step(self) -> list[tuple[str, bytes]]:
        """Advance one tick and return that tick's messages as (topic, payload) pairs."""
        self._advance()
        ts = self.sim_time
        out: list[tuple[str, bytes]] = []
        for topic, kind, source, samples in self._samples():
            seq = self._seq.get(topic, 0)
            self._seq[topic] = seq + 1
            out.append(
                (topic, encode(collector=COLLECTOR, source=source, seq=seq, ts=ts, samples=samples))
            )
            self.messages[kind] += 1
            self.published[kind] += len(samples)
        return out

    def advance(self) -> None:
        """Advance one tick as :meth:`step` does, without building its messages: a poller that
        reads every n-th tick. The random stream, the state and the next step's messages are
        the same as after a :meth:`step` (no draw happens while building messages)."""
        self._advance()

    def true_state(self) -> dict[str, Any]:
        """The latest tick's true (noise-free) values, as copies, for benchmarks and tests.

        ``gpu_ids`` and ``gpu_temp_c`` [°C] (core), ``gpu_power_w`` [W]; ``phase_ids``
        (``<pdu>/L1``..``L3`` per PDU in site order, three slots even for single-phase) and
        ``line_current_a`` [A]; ``breaker_ids`` and ``breaker_current_a`` [A]; ``cdu_names``
        with ``cdu_heat_kw`` [kW], ``cdu_flow_lpm`` [L/min], ``cdu_supply_c`` and
        ``cdu_return_c`` [°C]. Empty before the first :meth:`step`.
        """
        st = getattr(self, "_state", None)
        if st is None:
            return {}
        return {
            "gpu_ids": list(self._gpu_ids),
            "gpu_temp_c": self._temp.copy(),
            "gpu_power_w": st["power"].copy(),
            "phase_ids": [phase_id(p.name, k) for p in self._pdus for k in (1, 2, 3)],
            "line_current_a": st["line_current"].copy(),
            "breaker_ids": list(self._br_ids),
            "breaker_current_a": np.asarray(st["breaker_current"], float).copy(),
            "cdu_names": [c.name for c in self._cdus],
            "cdu_heat_kw": st["cdu_heat_kw"].copy(),
            "cdu_flow_lpm": st["cdu_flow"].copy(),
            "cdu_supply_c": st["cdu_supply"].copy(),
            "cdu_return_c": np.asarray(st["cdu_return"], float).copy(),
        }

    def truth(self) -> dict[str, Any]:
        """The true parameters of every device, JSON-serializable (see README.md)."""
        return self._truth()

    # ---- topology ------------------------------------------------------------------------------

    def _build_topology(self) -> None:
        """The index arrays of the site: GPUs, nodes, racks, CDUs, fleets, work groups, PDU
        circuits, breakers, pumps and links."""
        site = self.site
        self._index = index_site(site)
        self._racks = site.racks
        self._nodes = site.nodes
        self._rack_index = {r: i for i, r in enumerate(self._index.rack_names)}
        self._node_index = {n: i for i, n in enumerate(self._index.node_names)}
        self._build_gpus()
        self._build_node_maps()
        self._build_groups()
        self._build_pdus()
        self._build_breakers()
        self._build_pumps()
        self._build_links()

    def _build_gpus(self) -> None:
        """GPUs, node-major, and their catalog parameters."""
        nodes = self._nodes
        n_nodes = len(nodes)
        # GPUs, node-major (the site index's order): the GPUs of node i are
        # gpu_start[i]:gpu_start[i + 1].
        idx = self._index
        counts = np.diff(idx.node_gpu_start)
        self._gpu_start = idx.node_gpu_start.copy()
        self._n_gpus = int(self._gpu_start[-1])
        self._gpu_node = np.repeat(np.arange(n_nodes), counts)
        self._gpu_ids: list[str] = list(idx.gpu_ids)
        self._gpu_index = {g: i for i, g in enumerate(self._gpu_ids)}
        for n_i, uuids in enumerate(idx.node_uuids):
            for slot, uuid in enumerate(uuids):
                self._gpu_index.setdefault(uuid, int(self._gpu_start[n_i]) + slot)

        def per_gpu(attr: str) -> F64:
            return np.repeat(np.array([getattr(n.gpu_spec, attr) for n in nodes], float), counts)

        self._tdp = per_gpu("tdp_w")
        self._idle_nom = per_gpu("idle_w")
        self._max_op_c = per_gpu("max_operating_temp_c")
        self._slowdown_c = per_gpu("slowdown_temp_c")
        self._sm_clock = per_gpu("sm_clock_max_mhz")
        self._mem_clock = per_gpu("mem_clock_mhz")
        node_liquid = np.array([n.spec.cooling == "liquid" for n in nodes], dtype=bool)
        self._node_liquid = node_liquid
        self._gpu_liquid = node_liquid[self._gpu_node]
        r_liq, r_air = per_gpu("r_liquid_k_per_w"), per_gpu("r_air_k_per_w")
        t_liq, t_air = per_gpu("tau_liquid_s"), per_gpu("tau_air_s")
        self._r_nom = np.where(self._gpu_liquid, r_liq, r_air)
        self._tau_nom = np.where(self._gpu_liquid, t_liq, t_air)

    def _build_node_maps(self) -> None:
        """Nodes -> racks, CDUs and fleets."""
        site, racks, nodes = self.site, self._racks, self._nodes
        # Nodes -> racks, CDUs, fleets, phases.
        self._node_rack = self._index.node_rack.copy()
        cdus = site.cdus
        self._cdus = cdus
        cdu_index = {c.name: i for i, c in enumerate(cdus)}
        self._cdu_index = cdu_index
        self._rack_cdu = np.array(
            [cdu_index[r.cdu] if r.cdu is not None else -1 for r in racks], np.int64
        )
        node_cdu = self._rack_cdu[self._node_rack]
        self._gpu_cdu = np.where(self._gpu_liquid, node_cdu[self._gpu_node], -1)

        fleets = site.fleets
        self._fleets = fleets
        self._fleet_index = {f.name: i for i, f in enumerate(fleets)}
        fleet_of = site.fleet_of_node
        idle_slot = len(fleets)  # the "no fleet" slot
        self._node_fleet = np.array(
            [
                self._fleet_index[fleet_of[n.name].name] if n.name in fleet_of else idle_slot
                for n in nodes
            ],
            np.int64,
        )
        self._gpu_fleet = self._node_fleet[self._gpu_node]
        self._fleet_training = np.array([f.role == "training" for f in fleets] + [False])
        self._fleet_inference = np.array([f.role == "inference" for f in fleets] + [False])
        self._fleet_nodes = np.bincount(self._node_fleet, minlength=idle_slot + 1)

    def _build_groups(self) -> None:
        """The work groups of the nodes (training jobs, inference replica groups)."""
        nodes, fleets = self._nodes, self._fleets
        n_nodes = len(nodes)
        idle_slot = len(fleets)  # the "no fleet" slot
        rack_of = self.site.rack_of_node
        # Work groups (see TRAIN_JOB_NODES): training jobs of consecutive nodes of a fleet,
        # named "<fleet>/job<k>"; inference replica groups per (fleet, rack), named
        # "<fleet>/<rack>". Nodes in no fleet share the idle slot at the end.
        members: dict[tuple[int, str], list[int]] = {}
        for i, n in enumerate(nodes):
            f_i = int(self._node_fleet[i])
            if f_i != idle_slot:
                where = "" if fleets[f_i].role == "training" else rack_of[n.name].name
                members.setdefault((f_i, where), []).append(i)
        group_names: list[str] = []
        group_fleet: list[int] = []
        node_group = np.empty(n_nodes, np.int64)
        for (f_i, where), idx in members.items():
            if where:
                chunks = [(f"{fleets[f_i].name}/{where}", idx)]
            else:
                chunks = [
                    (f"{fleets[f_i].name}/job{k // TRAIN_JOB_NODES}", idx[k : k + TRAIN_JOB_NODES])
                    for k in range(0, len(idx), TRAIN_JOB_NODES)
                ]
            for name, chunk in chunks:
                node_group[chunk] = len(group_names)
                group_names.append(name)
                group_fleet.append(f_i)
        idle_group = len(group_names)
        node_group[self._node_fleet == idle_slot] = idle_group
        self._group_names = group_names
        self._group_fleet = np.array([*group_fleet, idle_slot], np.int64)
        self._node_group = node_group
        self._group_nodes = np.bincount(node_group, minlength=idle_group + 1)
        self._group_training = self._fleet_training[self._group_fleet]
        self._group_inference = self._fleet_inference[self._group_fleet]
        self._gpu_group = node_group[self._gpu_node]

    def _build_pdus(self) -> None:
        """The phase of each node, PDU circuits, their loads and environment."""
        racks, nodes = self._racks, self._nodes
        n_nodes = len(nodes)
        rack_of = self.site.rack_of_node
        node_phase = np.empty(n_nodes, np.int64)
        for r in racks:
            for k, n in enumerate(r.nodes):
                node_phase[self._node_index[n.name]] = (
                    int(n.phase[1]) - 1 if n.phase is not None else k % 3
                )
        self._node_phase = node_phase

        # PDUs: 3 circuit slots per PDU (wye/single: L1..L3; delta: L1-L2, L2-L3, L3-L1).
        pdus = self.site.pdus
        self._pdus = pdus
        pdu_index = {p.name: i for i, p in enumerate(pdus)}
        self._pdu_index = pdu_index
        n_pdus = len(pdus)
        self._pdu_delta = np.array([p.wiring == "delta" and p.phases == 3 for p in pdus], bool)
        self._pdu_wiring = ["single" if p.phases == 1 else p.wiring for p in pdus]
        self._pdu_vll = np.array([p.voltage_v for p in pdus], float)
        self._pdu_rated = np.array([p.rated_current_a for p in pdus], float)
        self._pdu_phases = np.array([p.phases for p in pdus], np.int64)
        v_circ = [
            float(electrical.phase_voltage_v(p.voltage_v, w))
            for p, w in zip(pdus, self._pdu_wiring, strict=True)
        ]
        # voltage across one load, which is also what a PDU reports per phase: line-to-neutral
        # for wye, line-to-line for delta and single-phase feeds
        self._circuit_v = np.repeat(np.array(v_circ, float), 3)
        ent_node: list[int] = []
        ent_circ: list[int] = []
        ent_w: list[float] = []
        for i, n in enumerate(nodes):
            rack = rack_of[n.name]
            for pname in rack.pdus:
                p = pdu_index[pname]
                ent_node.append(i)
                ent_circ.append(3 * p + (int(node_phase[i]) if pdus[p].phases == 3 else 0))
                ent_w.append(1.0 / len(rack.pdus))
        self._ent_node = np.array(ent_node, np.int64)
        self._ent_circ = np.array(ent_circ, np.int64)
        self._ent_w = np.array(ent_w, float)
        # PDU environment = mean of the racks it feeds.
        pr_pdu: list[int] = []
        pr_rack: list[int] = []
        for j, r in enumerate(racks):
            for pname in r.pdus:
                pr_pdu.append(pdu_index[pname])
                pr_rack.append(j)
        self._pr_pdu = np.array(pr_pdu, np.int64)
        self._pr_rack = np.array(pr_rack, np.int64)
        self._pdu_nracks = np.maximum(np.bincount(self._pr_pdu, minlength=n_pdus), 1)

    def _build_breakers(self) -> None:
        """Breakers: the current share of a circuit (branch or wye phase) or of a line."""
        pdus, pdu_index = self._pdus, self._pdu_index
        # Breakers: current share of a circuit (branch or wye phase) or of a line.
        br_from_line: list[bool] = []
        br_idx: list[int] = []
        br_share: list[float] = []
        br_ids: list[str] = []
        for p_i, p in enumerate(pdus):
            keys: list[tuple[str, int] | None] = []
            for b in p.breakers:
                keys.append(self._breaker_key(p, b.phase))
            for b, key in zip(p.breakers, keys, strict=True):
                br_ids.append(sub_id(p.name, b.name))
                if key is None:
                    br_from_line.append(False)
                    br_idx.append(-1)
                    br_share.append(0.0)
                else:
                    br_from_line.append(key[0] == "line")
                    br_idx.append(3 * p_i + key[1])
                    br_share.append(1.0 / keys.count(key))
        self._br_from_line = np.array(br_from_line, bool)
        self._br_idx = np.array(br_idx, np.int64)
        self._br_share = np.array(br_share, float)
        self._br_ids = br_ids
        self._br_pdu = np.array([pdu_index[split_sub_id(i)[0]] for i in br_ids], np.int64)

    def _build_pumps(self) -> None:
        """CDU pumps and the racks each CDU serves."""
        cdus, racks = self._cdus, self._racks
        # CDU pumps.
        pump_ids: list[str] = []
        pump_cdu: list[int] = []
        for c_i, c in enumerate(cdus):
            for pump in c.pumps:
                pump_ids.append(sub_id(c.name, pump))
                pump_cdu.append(c_i)
        self._pump_ids = pump_ids
        self._pump_index = {p: i for i, p in enumerate(pump_ids)}
        self._pump_cdu = np.array(pump_cdu, np.int64)
        self._cdu_npumps = np.bincount(self._pump_cdu, minlength=len(cdus)).astype(float)
        self._cdu_fluids = sorted({c.coolant for c in cdus})
        self._cdu_fluid = np.array([c.coolant for c in cdus])
        self._cdu_racks = [[r.name for r in racks if r.cdu == c.name] for c in cdus]

    @staticmethod
    def _breaker_key(pdu: Pdu, phase: str) -> tuple[str, int] | None:
        """Where a breaker's current comes from: ("circuit"|"line", slot) or None (no load)."""
        if pdu.phases == 1:
            return ("circuit", 0) if phase == "L1" else None
        if "-" in phase:
            if pdu.wiring != "delta":
                return None  # line-to-line breaker on a wye PDU: our loads are line-to-neutral
            return ("circuit", electrical.DELTA_BRANCHES.index(phase))
        return ("line" if pdu.wiring == "delta" else "circuit", int(phase[1]) - 1)

    def _build_links(self) -> None:
        site = self.site
        links = site.links
        self._links = links
        switches = {s.name: s for s in site.switches}
        node_names = set(self._node_index)
        n_links = len(links)

        # Nodes attached to each leaf: through node-leaf links, else the leaf's rack.
        node_deg = np.zeros(len(self._nodes))
        for link in links:
            for end in (link.a, link.b):
                if end in node_names:
                    node_deg[self._node_index[end]] += 1
        leaf_nodes: dict[str, set[int]] = {
            s: set() for s, sw in switches.items() if sw.role == "leaf"
        }
        for link in links:
            for end, other in ((link.a, link.b), (link.b, link.a)):
                if end in node_names and other in leaf_nodes:
                    leaf_nodes[other].add(self._node_index[end])
        for name, members in leaf_nodes.items():
            rack = switches[name].rack
            if not members and rack is not None:
                members.update(
                    self._node_index[n.name] for n in self._racks[self._rack_index[rack]].nodes
                )
        node_leaf = np.full(len(self._nodes), -1, np.int64)
        node_nleaves = np.zeros(len(self._nodes))  # a rail-optimized node hangs off several
        leaf_names = list(leaf_nodes)
        for li, name in enumerate(leaf_names):
            for n in sorted(leaf_nodes[name]):
                node_nleaves[n] += 1
                if node_leaf[n] < 0:
                    node_leaf[n] = li
        node_nleaves = np.maximum(node_nleaves, 1)
        # Share of a node's traffic that leaves its leaf: training peers are spread uniformly
        # over the fleet's other nodes; inference and idle traffic all goes out.
        out_frac = np.ones(len(self._nodes))
        for f_i, f in enumerate(self._fleets):
            if f.role != "training":
                continue
            members = np.flatnonzero(self._node_fleet == f_i)
            if len(members) <= 1:
                out_frac[members] = 0.0
                continue
            for n in members:
                same = (
                    np.count_nonzero(node_leaf[members] == node_leaf[n]) if node_leaf[n] >= 0 else 1
                )
                out_frac[n] = (len(members) - same) / (len(members) - 1)
        self._node_out_frac = out_frac

        uplinks: dict[str, int] = dict.fromkeys(leaf_names, 0)
        for link in links:
            ends = (link.a, link.b)
            roles = [switches[e].role if e in switches else None for e in ends]
            if sorted(r or "" for r in roles) == ["leaf", "spine"]:
                uplinks[ends[roles.index("leaf")]] += 1

        rows: list[int] = []
        e_node: list[int] = []
        e_w: list[float] = []
        e_rx: list[bool] = []
        owner: list[str] = []
        for l_i, link in enumerate(links):
            ends = (link.a, link.b)
            roles = [switches[e].role if e in switches else None for e in ends]
            if "leaf" in roles:
                owner.append(ends[roles.index("leaf")])
            elif roles[0] is not None or roles[1] is not None:
                owner.append(ends[0] if roles[0] is not None else ends[1])
            else:
                owner.append(link.a)
            for d, (src, dst) in enumerate(((link.a, link.b), (link.b, link.a))):
                row = 2 * l_i + d
                if src in node_names:  # node -> switch: the node's transmit
                    n = self._node_index[src]
                    rows.append(row)
                    e_node.append(n)
                    e_w.append(1.0 / node_deg[n])
                    e_rx.append(False)
                elif dst in node_names:  # switch -> node: the node's receive
                    n = self._node_index[dst]
                    rows.append(row)
                    e_node.append(n)
                    e_w.append(1.0 / node_deg[n])
                    e_rx.append(True)
                elif src in leaf_nodes and switches.get(dst) and switches[dst].role == "spine":
                    for n in sorted(leaf_nodes[src]):
                        rows.append(row)
                        e_node.append(n)
                        e_w.append(out_frac[n] / uplinks[src] / node_nleaves[n])
                        e_rx.append(False)
                elif dst in leaf_nodes and switches.get(src) and switches[src].role == "spine":
                    for n in sorted(leaf_nodes[dst]):
                        rows.append(row)
                        e_node.append(n)
                        e_w.append(out_frac[n] / uplinks[dst] / node_nleaves[n])
                        e_rx.append(True)
        self._lk_row = np.array(rows, np.int64)
        self._lk_node = np.array(e_node, np.int64)
        self._lk_w = np.array(e_w, float)
        self._lk_rx = np.array(e_rx, bool)
        self._link_owner = owner
        self._link_capacity_bps = np.array([link.capacity_gbps * 1e9 for link in links], float)
        self._n_links = n_links

    # ---- faults ---------------------------------------------------------------------------------

    def _resolve_faults(self) -> None:
        """Check every fault's target against the site and index it."""
        self._fault_index: list[int] = []
        for f in self.faults:
            t = f.target
            if f.kind in ("cold_plate", "cold_plate_decay"):
                if t not in self._gpu_index:
                    raise ValueError(
                        f"fault {f}: unknown GPU {t!r}; expected <node>:<index> of a site node"
                    )
                if f.magnitude is not None and f.magnitude <= -1:
                    raise ValueError(f"fault {f}: cold_plate magnitude must be > -1")
                self._fault_index.append(self._gpu_index[t])
            elif f.kind == "pump_failure":
                if t not in self._pump_index:
                    raise ValueError(
                        f"fault {f}: unknown pump {t!r}; site pumps are {self._pump_ids}"
                    )
                self._fault_index.append(self._pump_index[t])
            elif f.kind in ("phase_overload", "phase_creep"):
                pdu_name, phase = split_sub_id(t)
                if pdu_name not in self._pdu_index:
                    raise ValueError(f"fault {f}: unknown PDU {pdu_name!r} in target {t!r}")
                p = self._pdu_index[pdu_name]
                n_ph = int(self._pdu_phases[p])
                leg = phase_leg(phase or "")
                if leg is None or leg > n_ph:
                    raise ValueError(
                        f"fault {f}: unknown phase {phase!r} of PDU {pdu_name!r}; expected "
                        f"{', '.join(phase_ids(pdu_name, n_ph))}"
                    )
                if f.magnitude is not None and f.magnitude < 0:
                    raise ValueError(f"fault {f}: {f.kind} magnitude [W] must be >= 0")
                self._fault_index.append(3 * p + leg - 1)
            elif f.kind == "fleet_idle":
                if t not in self._fleet_index:
                    raise ValueError(
                        f"fault {f}: unknown fleet {t!r}; site fleets are {list(self._fleet_index)}"
                    )
                if f.magnitude is not None and not 0 <= f.magnitude <= 1:
                    raise ValueError(f"fault {f}: fleet_idle magnitude (activity) must be in 0..1")
                self._fault_index.append(self._fleet_index[t])
        # Effective magnitudes: cold_plate defaults are set once R is drawn, phase_overload
        # defaults when the fault starts.
        self._fault_value: list[float | None] = [f.magnitude for f in self.faults]

    def _default_fault_magnitudes(self, first: int) -> None:
        """Cold-plate faults from number ``first`` on without a magnitude: +0.1 K/W over R."""
        for i in range(first, len(self.faults)):
            f = self.faults[i]
            if f.kind in ("cold_plate", "cold_plate_decay") and f.magnitude is None:
                self._fault_value[i] = 0.1 / float(self._r[self._fault_index[i]])

    def add_faults(self, faults: Sequence[Fault]) -> None:
        """Inject ``faults`` into a running simulation: each acts from its own start time (one
        whose window is already over does nothing). Targets are checked as by the constructor.
        No random number is drawn, so a copy of a run given the faults now continues exactly as
        a run that had them from the start (faults draw nothing before they begin)."""
        kept = list(self._fault_value)
        self.faults = (*self.faults, *faults)
        self._resolve_faults()
        self._fault_value[: len(kept)] = kept  # effective magnitudes already set stay
        self._default_fault_magnitudes(len(kept))

    # ---- parameters ---------------------------------------------------------------------------

    def _draw_parameters(self) -> None:
        rng = self._rng
        g = self._n_gpus
        n_nodes = len(self._nodes)
        n_racks = len(self._racks)
        n_fleets = len(self._fleets)
        n_cdus = len(self._cdus)
        n_pdus = len(self._pdus)

        # GPUs
        self._idle = self._idle_nom * _spread(rng, IDLE_SPREAD, g)
        self._limit = self._tdp.copy()
        self._gamma = _uniform(rng, GAMMA_RANGE, g)
        self._r = self._r_nom * _spread(rng, R_SPREAD, g)
        tau = self._tau_nom * _spread(rng, TAU_SPREAD, g)
        self._c = tau / self._r
        self._mem_r = MEM_R_FACTOR * self._r * _spread(rng, 0.05, g)
        self._mem_c = MEM_TAU_FACTOR * tau / self._mem_r
        self._coolant_offset = np.where(self._gpu_liquid, _uniform(rng, COOLANT_OFFSET_K, g), 0.0)
        self._energy_j = rng.uniform(1e6, 5e9, g).round()
        self._default_fault_magnitudes(0)

        # Nodes
        specs = [n.spec for n in self._nodes]
        self._base_w = np.array([s.base_w for s in specs]) * _spread(rng, NODE_BASE_SPREAD, n_nodes)
        self._overhead = np.array([s.gpu_overhead_frac for s in specs]) * _spread(
            rng, NODE_OVERHEAD_SPREAD, n_nodes
        )

        # Racks
        cap = np.array([self.site.capture_fraction(r) for r in self._racks], float)
        cap = np.clip(cap + rng.uniform(-CAPTURE_SPREAD, CAPTURE_SPREAD, n_racks), 0.0, 1.0)
        self._capture = np.where(self._rack_cdu >= 0, cap, 0.0)
        self._rack_inlet = _uniform(rng, RACK_INLET_C, n_racks)
        self._rack_swing = _uniform(rng, RACK_INLET_SWING_K, n_racks)
        self._rack_humidity = _uniform(rng, RACK_HUMIDITY_PCT, n_racks)

        # Fleets and work groups (each with an idle slot at the end)
        n_groups = len(self._group_names)
        self._infer_base = np.append(_uniform(rng, INFER_BASE, n_fleets), IDLE_ACTIVITY)
        self._infer_amp = np.append(_uniform(rng, INFER_AMPLITUDE, n_fleets), 0.0)
        self._infer_peak = np.append(_uniform(rng, INFER_PEAK_HOUR_UTC, n_fleets), 14.0)
        self._infer_weekend = np.append(_uniform(rng, INFER_WEEKEND, n_fleets), 1.0)
        train = self._group_training
        self._train_level = np.append(_uniform(rng, TRAIN_LEVEL, n_groups), IDLE_ACTIVITY)
        self._step_s = np.append(_uniform(rng, TRAIN_STEP_S, n_groups), 1.0)
        self._group_share = np.append(_uniform(rng, INFER_GROUP_SHARE, n_groups), 1.0)
        self._run_range = np.where(train[:, None], TRAIN_RUN_S, INFER_RUN_S)
        self._gap_range = np.where(train[:, None], TRAIN_GAP_S, INFER_GAP_S)
        self._ramp_range = np.where(train[:, None], TRAIN_RAMP_S, INFER_RAMP_S)
        # every group starts mid-run: at a random checkpoint phase, interrupted within one run
        self._gap_end = -rng.uniform(0.0, CHECKPOINT_PERIOD_S, n_groups + 1)
        self._ramp_s = np.zeros(n_groups + 1)
        self._run_end = rng.uniform(0.0, 1.0, n_groups + 1) * self._run_range[:, 1]
        self._run_end[-1] = np.inf  # the idle slot is never interrupted
        self._group_noise = np.zeros(n_groups + 1)
        self._gpu_share = np.where(
            self._fleet_training[self._gpu_fleet],
            _spread(rng, TRAIN_GPU_SPREAD, g),
            np.where(
                self._fleet_inference[self._gpu_fleet], _uniform(rng, INFER_GPU_SHARE, g), 1.0
            ),
        )
        self._noise_sigma = np.where(  # white (training, idle) noise averages like a reading
            self._fleet_training[self._gpu_fleet],
            TRAIN_NOISE * self._meas,
            np.where(self._fleet_inference[self._gpu_fleet], INFER_NOISE, IDLE_NOISE * self._meas),
        )
        phi_infer = math.exp(-self.dt_s / INFER_NOISE_TAU_S)
        self._noise_phi = np.where(self._fleet_inference[self._gpu_fleet], phi_infer, 0.0)
        self._noise = rng.standard_normal(g) * self._noise_sigma

        # PDUs
        self._pdu_pf = _uniform(rng, PDU_POWER_FACTOR, n_pdus)
        us = (np.abs(self._pdu_vll - 208.0) < 15) | (np.abs(self._pdu_vll - 480.0) < 25)
        self._pdu_freq = np.where(us, 60.0, 50.0)
        self._pdu_energy_kwh = rng.uniform(1e3, 1e5, n_pdus).round(1)

        # CDUs
        approach = np.array([c.approach_k for c in self._cdus], float)
        self._approach = approach * _spread(rng, APPROACH_SPREAD, n_cdus)
        self._cdu_capacity = np.array([c.capacity_kw for c in self._cdus], float)
        self._cdu_setpoint = np.array([c.supply_setpoint_c for c in self._cdus], float)
        self._fw_base = np.array([c.fw_supply_temp_c for c in self._cdus], float)
        self._max_flow = np.array([c.max_flow_lpm for c in self._cdus], float)
        self._design_dp = np.array(
            [
                CDU_MODELS[c.model].design_dp_kpa if c.model else DEFAULT_DESIGN_DP_KPA
                for c in self._cdus
            ],
            float,
        )
        h0, kp, ks = cdu_model.pump_curve_from_design(
            self._max_flow, self._design_dp, np.maximum(self._cdu_npumps, 1)
        )
        self._h0 = h0 * _spread(rng, PUMP_CURVE_SPREAD, n_cdus)
        self._kp = kp * _spread(rng, PUMP_CURVE_SPREAD, n_cdus)
        self._ks = ks * _spread(rng, PUMP_CURVE_SPREAD, n_cdus)
        self._pump_rated_w = cdu_model.pump_rated_power_w(
            self._max_flow, self._design_dp, np.maximum(self._cdu_npumps, 1), PUMP_EFFICIENCY
        )
        self._flow_nominal = cdu_model.parallel_pump_flow_lpm(
            self._cdu_npumps.astype(float), PUMP_SPEED, self._h0, self._kp, self._ks
        )
        self._loop_tau = LOOP_TAU_S * _spread(rng, 0.2, n_cdus)
        self._fw_drift = _uniform(rng, FW_DRIFT_K, n_cdus)
        self._fw_period = _uniform(rng, FW_DRIFT_PERIOD_S, n_cdus)
        self._fw_phase = rng.uniform(0, 2 * np.pi, n_cdus)
        self._fw_flow = self._max_flow * _spread(rng, FW_FLOW_SPREAD, n_cdus)

        # Links
        self._link_background = _uniform(rng, LINK_BACKGROUND_BPS, 2 * self._n_links)
        self._link_errors = np.zeros(self._n_links, np.int64)

        # Dynamic state, set on the first tick.
        self._temp = np.zeros(g)
        self._mem_temp = np.zeros(g)
        self._throttled = np.zeros(g, bool)
        self._prev: dict[str, F64] = {}
        self._cdu_return = np.zeros(n_cdus)

    # ---- one tick ------------------------------------------------------------------------------

    def _active(self, kind: str, t: float) -> list[tuple[int, float | None, int]]:
        """(target index, magnitude, fault number) of the faults of ``kind`` active at ``t``."""
        return [
            (self._fault_index[i], self._fault_value[i], i)
            for i, f in enumerate(self.faults)
            if f.kind == kind and f.active(t)
        ]

    def _hour_utc(self) -> float:
        """Hour of the day (UTC, fractional) of the latest tick."""
        now = self.sim_time
        return now.hour + now.minute / 60 + (now.second + now.microsecond / 1e6) / 3600

    def _activity(self, t: float) -> F64:
        rng = self._rng
        n = len(self._group_names) + 1
        hour = self._hour_utc()
        # interruptions: a group whose run is over drains (gap), then warms up (ramp); the
        # draws happen every tick, whatever happens, so faults never change the random stream
        gap = rng.uniform(self._gap_range[:, 0], self._gap_range[:, 1], n)
        ramp = rng.uniform(self._ramp_range[:, 0], self._ramp_range[:, 1], n)
        run = rng.uniform(self._run_range[:, 0], self._run_range[:, 1], n)
        over = (t >= self._run_end) & (t > 0)
        self._gap_end = np.where(over, t + gap, self._gap_end)
        self._ramp_s = np.where(over, ramp, self._ramp_s)
        self._run_end = np.where(over, t + gap + ramp + run, self._run_end)
        since = t - self._gap_end
        up = np.clip(since / np.maximum(self._ramp_s, 1e-9), 0.0, 1.0)  # 0 in the gap, 1 running
        # training: level with checkpoint dips counted from the end of the warm-up
        running = since - self._ramp_s
        ckpt = (running >= 0) & (
            running % CHECKPOINT_PERIOD_S >= CHECKPOINT_PERIOD_S - CHECKPOINT_DURATION_S
        )
        train = np.where(ckpt, CHECKPOINT_ACTIVITY, self._train_level)
        # inference: daily and weekly cycle, the group's share and its slow load noise
        fleet = self._group_fleet
        daily = np.maximum(0.0, np.sin(2 * np.pi * (hour - (self._infer_peak - 6.0)) / 24.0))
        weekend = self._infer_weekend if self.sim_time.weekday() >= 5 else 1.0
        fleet_load = (self._infer_base + self._infer_amp * daily) * weekend
        phi = math.exp(-self.dt_s / INFER_GROUP_TAU_S)
        self._group_noise = phi * self._group_noise + math.sqrt(
            1.0 - phi**2
        ) * INFER_GROUP_NOISE * rng.standard_normal(n)
        infer = fleet_load[fleet] * self._group_share * (1.0 + self._group_noise)
        busy = np.where(self._group_training, train, np.where(self._group_inference, infer, 0.0))
        level = IDLE_ACTIVITY + (busy - IDLE_ACTIVITY) * up
        level[-1] = IDLE_ACTIVITY
        for f_i, mag, _ in self._active("fleet_idle", t):
            level[fleet == f_i] = FLEET_IDLE_ACTIVITY if mag is None else mag
        self._group_level = level
        eps = rng.standard_normal(self._n_gpus)
        phi_g = self._noise_phi
        self._noise = phi_g * self._noise + np.sqrt(1.0 - phi_g**2) * self._noise_sigma * eps
        return np.clip(level[self._gpu_group] * self._gpu_share + self._noise, 0.0, 1.0)

    def _advance(self) -> None:
        """One tick: thermal state, workload, loop flow, thermal control, power, cooling,
        links, then the measurements (their noise drawn in a fixed order)."""
        rng = self._rng
        self._tick += 1
        t = self.elapsed_s
        dt = self.dt_s
        first = self._tick == 0
        hour = self._hour_utc()

        # -- thermal state from the previous tick's inputs (zero-order hold)
        if not first:
            prev = self._prev
            self._temp = gpu_thermal.rc_step(
                self._temp, prev["ref"], prev["power"], prev["r"], self._c, dt
            )
            self._mem_temp = gpu_thermal.rc_step(
                self._mem_temp, prev["ref"], prev["power"], prev["mem_r"], self._mem_c, dt
            )
            self._energy_j = self._energy_j + prev["power"] * dt

        # -- workload and power
        activity = self._activity(t)
        p_demand = gpu_power.gpu_power_w(activity, self._idle, self._limit, self._gamma)
        pump_running, flow, r_eff, mem_r_eff = self._loop_flow(t)
        fw_supply, supply, rack_air, ref = self._references(t, hour)
        power, frac, _, throttle = self._thermal_control(first, ref, p_demand, r_eff, mem_r_eff)
        el = self._electrical(t, dt, power, activity)
        cool = self._cooling(first, dt, el["rack_power"], supply, flow, pump_running)
        flows = self._link_flows(el["node_act"])
        self._measure(rng, activity, power, frac, throttle, rack_air, el)
        self._m_cdu = self._measure_cdu(rng, supply, flow, fw_supply, cool)
        self._measure_links(rng, flows)
        rack_power, node_in = el["rack_power"], el["node_in"]
        circ_p, line_i, heat_true = el["circ_p"], el["line_i"], cool["heat_true"]
        # true values a test or a calibrator may want
        self._state = {
            "activity": activity,
            "power": power,
            "ref": ref,
            "r_eff": r_eff,
            "node_in": node_in,
            "rack_power": rack_power,
            "circuit_power": circ_p,
            "line_current": line_i,
            "breaker_current": el["br_i"],
            "cdu_heat_kw": heat_true,
            "cdu_supply": supply,
            "cdu_flow": flow,
            "cdu_return": self._cdu_return,
        }

    def _loop_flow(self, t: float) -> tuple[NDArray[np.bool_], F64, F64, F64]:
        """Pumps running, loop flow per CDU, and each GPU's R and memory R at that flow: a
        cold plate's R rises as its flow falls (docs/physics.md §2.2), and by cold-plate faults."""
        n_cdus = len(self._cdus)
        pump_running = np.ones(len(self._pump_ids), bool)
        for p_i, _, _ in self._active("pump_failure", t):
            pump_running[p_i] = False
        n_running = np.bincount(self._pump_cdu, weights=pump_running, minlength=n_cdus)
        flow = cdu_model.parallel_pump_flow_lpm(n_running, PUMP_SPEED, self._h0, self._kp, self._ks)
        flow_ratio = np.ones(self._n_gpus)
        if n_cdus:
            cdu_ratio = flow / np.maximum(self._flow_nominal, 1e-9)
            flow_ratio = np.where(self._gpu_liquid, cdu_ratio[np.maximum(self._gpu_cdu, 0)], 1.0)
        r_eff = gpu_thermal.r_at_flow_k_per_w(self._r, flow_ratio)
        mem_r_eff = gpu_thermal.r_at_flow_k_per_w(self._mem_r, flow_ratio)
        for kind in ("cold_plate", "cold_plate_decay"):
            for g_i, mag, k in self._active(kind, t):
                r_eff[g_i] *= 1.0 + float(mag) * self.faults[k].ramp_fraction(t)  # type: ignore[arg-type]
        return pump_running, flow, r_eff, mem_r_eff

    def _references(self, t: float, hour: float) -> tuple[F64, F64, F64, F64]:
        """Facility-water supply and CDU supply per CDU, rack inlet air, and the temperature
        each GPU sits above (its loop's coolant or its rack's air)."""
        fw_supply = self._fw_base + self._fw_drift * np.sin(
            2 * np.pi * t / self._fw_period + self._fw_phase
        )
        supply = cdu_model.supply_temp_c(fw_supply, self._approach, self._cdu_setpoint)
        rack_air = self._rack_inlet + self._rack_swing * np.sin(2 * np.pi * (hour - 9.0) / 24.0)
        ref = np.where(
            self._gpu_liquid,
            supply[np.maximum(self._gpu_cdu, 0)] + self._coolant_offset if len(supply) else 0.0,
            rack_air[self._node_rack[self._gpu_node]],
        )
        return fw_supply, supply, rack_air, ref

    def _thermal_control(
        self, first: bool, ref: F64, p_demand: F64, r_eff: F64, mem_r_eff: F64
    ) -> tuple[F64, F64, NDArray[np.bool_], NDArray[np.int64]]:
        """Thermal slowdown: hold the max operating temperature by capping power. Returns the
        power drawn, the fraction of the dynamic power kept, the GPUs in hardware slowdown and
        the NVML throttle-reason bits."""
        dynamic = p_demand - self._idle
        p_thermal = (self._max_op_c - ref) / r_eff
        # the firmware reads the temperature of this tick; on the first tick, the steady state
        t_check = gpu_thermal.steady_temp_c(ref, p_demand, r_eff) if first else self._temp
        self._throttled = np.where(
            self._throttled,
            t_check > self._max_op_c - THERMAL_RELEASE_K,
            t_check >= self._max_op_c - 0.5,
        )
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(dynamic > 0, (p_thermal - self._idle) / dynamic, 1.0)
        frac = np.where(self._throttled, np.clip(frac, THERMAL_MIN_FRACTION, 1.0), 1.0)
        hw_slow = t_check >= self._slowdown_c
        frac = np.where(hw_slow, THERMAL_MIN_FRACTION, frac)
        power = self._idle + dynamic * frac
        if first:
            self._temp = gpu_thermal.steady_temp_c(ref, power, r_eff)
            self._mem_temp = gpu_thermal.steady_temp_c(ref, power, mem_r_eff)
        self._prev = {"ref": ref, "power": power, "r": r_eff, "mem_r": mem_r_eff}
        throttle = np.where(p_demand >= self._limit - 1e-9, THROTTLE_SW_POWER_CAP, 0)
        throttle = throttle | np.where(frac < 1.0, THROTTLE_SW_THERMAL, 0)
        throttle = throttle | np.where(hw_slow, THROTTLE_HW_THERMAL, 0)
        return power, frac, hw_slow, throttle

    def _electrical(self, t: float, dt: float, power: F64, activity: F64) -> dict[str, Any]:
        """Node, rack, PDU circuit, line and breaker power and current (and the PDU energy)."""
        n_nodes = len(self._nodes)
        sum_gpu = np.bincount(self._gpu_node, weights=power, minlength=n_nodes)
        node_dc = electrical.node_power_w(sum_gpu, self._base_w, self._overhead)
        node_in = electrical.psu_input_w(node_dc, PSU_LOSS_CONST_W, PSU_EFFICIENCY)
        node_act = np.bincount(self._gpu_node, weights=activity, minlength=n_nodes) / np.maximum(
            np.diff(self._gpu_start), 1
        )
        rack_power = np.bincount(self._node_rack, weights=node_in, minlength=len(self._racks))

        # -- PDUs
        n_pdus = len(self._pdus)
        circ_p = np.bincount(
            self._ent_circ, weights=node_in[self._ent_node] * self._ent_w, minlength=3 * n_pdus
        )
        pf3 = np.repeat(self._pdu_pf, 3)
        for kind in ("phase_overload", "phase_creep"):
            for c_i, mag, k in self._active(kind, t):
                if mag is None:
                    mag = self._overload_default_w(c_i, circ_p, pf3)
                    self._fault_value[k] = mag
                circ_p[c_i] += mag * self.faults[k].ramp_fraction(t)
        circ_i = circ_p / (self._circuit_v * pf3) if n_pdus else circ_p
        circ3 = circ_i.reshape(n_pdus, 3)
        line_i = np.where(
            self._pdu_delta[:, None], electrical.delta_line_currents_a(circ3), circ3
        ).reshape(-1)
        circ_p3 = circ_p.reshape(n_pdus, 3)
        line_p = np.where(
            self._pdu_delta[:, None], 0.5 * (circ_p3 + np.roll(circ_p3, 1, axis=1)), circ_p3
        ).reshape(-1)
        pdu_power = circ_p3.sum(axis=1)
        self._pdu_energy_kwh = self._pdu_energy_kwh + pdu_power * dt / 3.6e6
        br_i = (
            np.where(
                self._br_from_line,
                line_i[np.maximum(self._br_idx, 0)] if len(line_i) else 0.0,
                circ_i[np.maximum(self._br_idx, 0)] if len(circ_i) else 0.0,
            )
            * self._br_share
        )
        return {
            "node_in": node_in,
            "node_act": node_act,
            "rack_power": rack_power,
            "circ_p": circ_p,
            "pf3": pf3,
            "line_i": line_i,
            "line_p": line_p,
            "pdu_power": pdu_power,
            "br_i": br_i,
        }

    def _cooling(
        self,
        first: bool,
        dt: float,
        rack_power: F64,
        supply: F64,
        flow: F64,
        pump_running: NDArray[np.bool_],
    ) -> dict[str, Any]:
        """CDU heat, return temperature (a first-order loop), pressure drop and pumps."""
        n_cdus = len(self._cdus)
        rack_liquid_kw = self._capture * rack_power / 1000.0
        has = self._rack_cdu >= 0
        heat_true = np.bincount(self._rack_cdu[has], weights=rack_liquid_kw[has], minlength=n_cdus)
        ret_target = np.zeros(n_cdus)
        for fluid in self._cdu_fluids:
            m = self._cdu_fluid == fluid
            ret_target[m] = coolant.return_temp_c(
                supply[m], heat_true[m], np.maximum(flow[m], MIN_FLOW_LPM), fluid
            )
        ret_target = np.minimum(ret_target, supply + MAX_LOOP_RISE_K)
        if first:
            self._cdu_return = ret_target
        else:
            decay = np.exp(-dt / self._loop_tau)
            self._cdu_return = ret_target + (self._cdu_return - ret_target) * decay
        dp = cdu_model.loop_dp_kpa(flow, self._ks)
        pump_speed = np.where(pump_running, PUMP_SPEED, 0.0)
        pump_w = cdu_model.pump_power_w(pump_speed, self._pump_rated_w[self._pump_cdu])
        cdu_pump_w = np.bincount(self._pump_cdu, weights=pump_w, minlength=n_cdus)
        return {
            "heat_true": heat_true,
            "dp": dp,
            "pump_speed": pump_speed,
            "pump_w": pump_w,
            "cdu_pump_w": cdu_pump_w,
        }

    def _link_flows(self, node_act: F64) -> F64:
        """Traffic per link direction (tx, rx interleaved) from the nodes' activity."""
        node_tx, node_rx = self._node_traffic(node_act)
        if self._n_links:
            vals = (
                np.where(self._lk_rx, node_rx[self._lk_node], node_tx[self._lk_node]) * self._lk_w
            )
            flows = np.bincount(self._lk_row, weights=vals, minlength=2 * self._n_links)
            flows = flows + self._link_background
        else:
            flows = np.zeros(0)
        return flows

    def _measure(
        self,
        rng: np.random.Generator,
        activity: F64,
        power: F64,
        frac: F64,
        throttle: NDArray[np.int64],
        rack_air: F64,
        el: dict[str, Any],
    ) -> None:
        """The GPU, node and PDU readings of this tick, with their noise."""
        n_nodes, n_pdus = len(self._nodes), len(self._pdus)
        node_in, node_act, pdu_power = el["node_in"], el["node_act"], el["pdu_power"]
        line_i, line_p, pf3, br_i = el["line_i"], el["line_p"], el["pf3"], el["br_i"]
        g = self._n_gpus
        self._m_gpu = {
            "activity": activity,
            "power": np.maximum(
                power * (1 + POWER_NOISE * self._meas * rng.standard_normal(g)), 0.0
            ),
            "temp": self._temp + TEMP_NOISE_K * self._meas * rng.standard_normal(g),
            "mem_temp": self._mem_temp + TEMP_NOISE_K * self._meas * rng.standard_normal(g),
            "clock": self._sm_clock * np.where(frac < 1.0, frac, 1.0),
            "throttle": throttle,
        }
        inlet_meas = rack_air[self._node_rack] + 0.2 * rng.standard_normal(n_nodes)
        self._m_node = {
            "power": node_in * (1 + NODE_POWER_NOISE * self._meas * rng.standard_normal(n_nodes)),
            "inlet": inlet_meas,
            "cpu": np.clip(3.0 + 25.0 * node_act + rng.standard_normal(n_nodes), 0.0, 100.0),
        }
        pdu_air = np.bincount(self._pr_pdu, weights=rack_air[self._pr_rack], minlength=n_pdus)
        pdu_hum = np.bincount(
            self._pr_pdu, weights=self._rack_humidity[self._pr_rack], minlength=n_pdus
        )
        nc = 3 * n_pdus
        self._m_pdu = {
            "power": pdu_power * (1 + 0.002 * rng.standard_normal(n_pdus)),
            "energy": self._pdu_energy_kwh,
            "inlet": pdu_air / self._pdu_nracks + 0.2 * rng.standard_normal(n_pdus),
            "humidity": pdu_hum / self._pdu_nracks + 0.5 * rng.standard_normal(n_pdus),
            "freq": self._pdu_freq + 0.005 * rng.standard_normal(n_pdus),
            "line_i": line_i * (1 + 0.003 * rng.standard_normal(nc)),
            "line_p": line_p * (1 + 0.003 * rng.standard_normal(nc)),
            "voltage": self._circuit_v * (1 + 0.003 * rng.standard_normal(nc)),
            "pf": np.clip(pf3 + 0.002 * rng.standard_normal(nc), 0.0, 1.0),
            "breaker_i": br_i * (1 + 0.003 * rng.standard_normal(len(br_i))),
        }

    def _measure_cdu(
        self,
        rng: np.random.Generator,
        supply: F64,
        flow: F64,
        fw_supply: F64,
        cool: dict[str, Any],
    ) -> dict[str, F64]:
        """The CDU readings of this tick, with their noise."""
        n_cdus = len(self._cdus)
        dp, pump_speed, pump_w = cool["dp"], cool["pump_speed"], cool["pump_w"]
        cdu_pump_w = cool["cdu_pump_w"]
        sup_m = supply + CDU_TEMP_NOISE_K * self._meas * rng.standard_normal(n_cdus)
        ret_m = self._cdu_return + CDU_TEMP_NOISE_K * self._meas * rng.standard_normal(n_cdus)
        flow_m = flow * (1 + CDU_FLOW_NOISE * self._meas * rng.standard_normal(n_cdus))
        heat_m = np.zeros(n_cdus)
        fw_ret = np.zeros(n_cdus)
        for fluid in self._cdu_fluids:
            m = self._cdu_fluid == fluid
            heat_m[m] = coolant.heat_kw(flow_m[m], sup_m[m], ret_m[m], fluid)
            heat_tcs = coolant.heat_kw(flow[m], supply[m], self._cdu_return[m], fluid)
            fw_ret[m] = coolant.return_temp_c(fw_supply[m], heat_tcs, self._fw_flow[m], "water")
        return {
            "supply": sup_m,
            "return": ret_m,
            "flow": flow_m,
            "dp": dp * (1 + CDU_FLOW_NOISE * self._meas * rng.standard_normal(n_cdus)),
            "fw_supply": fw_supply + CDU_TEMP_NOISE_K * self._meas * rng.standard_normal(n_cdus),
            "fw_return": fw_ret + CDU_TEMP_NOISE_K * self._meas * rng.standard_normal(n_cdus),
            "fw_flow": self._fw_flow
            * (1 + CDU_FLOW_NOISE * self._meas * rng.standard_normal(n_cdus)),
            "heat": np.maximum(heat_m, 0.0),
            "pump_w": cdu_pump_w,
            "pump_speed": pump_speed,
            "pump_each_w": pump_w,
        }

    def _measure_links(self, rng: np.random.Generator, flows: F64) -> None:
        """The link readings of this tick (rates clipped below capacity, errors counted)."""
        nl = self._n_links
        if nl:
            rates = flows * (1 + LINK_NOISE * self._meas * rng.standard_normal(2 * nl))
            cap2 = np.repeat(self._link_capacity_bps, 2)
            rates = np.clip(rates, 0.0, 0.98 * cap2)
            self._link_errors = self._link_errors + (rng.random(nl) < LINK_ERROR_PROB)
            self._m_link = {"tx": rates[0::2], "rx": rates[1::2], "errors": self._link_errors}
        else:
            self._m_link = {"tx": flows, "rx": flows, "errors": self._link_errors}

    def _overload_default_w(self, c_i: int, circ_p: F64, pf3: F64) -> float:
        """Extra load [W] on circuit slot ``c_i`` that takes its line to 95 % of the rating."""
        p = c_i // 3
        target = PHASE_OVERLOAD_TARGET * float(self._pdu_rated[p])
        v = float(self._circuit_v[c_i])
        pf = float(pf3[c_i])
        cur = circ_p[3 * p : 3 * p + 3] / (v * pf)
        line = c_i % 3
        if self._pdu_delta[p]:
            # line i = branch i (L_i-L_i+1) and branch i-1; add the load on branch i
            b = float(cur[(line - 1) % 3])
            a_now = float(cur[line])
            a_new = 0.5 * (-b + math.sqrt(max(4 * target**2 - 3 * b**2, 0.0)))
            extra_a = max(a_new - a_now, 0.0)
        else:
            extra_a = max(target - float(cur[line]), 0.0)
        return extra_a * v * pf

    def _node_traffic(self, node_act: F64) -> tuple[F64, F64]:
        """Per-node network transmit and receive rates [bit/s]."""
        fleet = self._node_fleet
        group = self._node_group
        n_nodes = self._group_nodes[group].astype(float)
        size = TRAIN_PARAMS * GRAD_BYTES
        train_bps = (
            8.0
            * network.allreduce_bytes_per_rank(size, np.maximum(n_nodes, 1))
            / self._step_s[group]
        )
        level = np.maximum(self._train_level[group], 1e-3)
        train = train_bps * np.clip(node_act / level, 0.0, 1.2)
        infer = INFER_NODE_BPS * node_act
        training = self._fleet_training[fleet]
        inference = self._fleet_inference[fleet]
        tx = np.where(training, train, np.where(inference, infer, IDLE_NODE_BPS))
        rx = np.where(inference, 0.5 * tx, tx)
        return tx, rx

    # ---- messages ------------------------------------------------------------------------------

    def _build_message_layout(self) -> None:
        site = self.site.name
        self._node_names = [n.name for n in self._nodes]
        self._topic_gpu = [topic_for(site, "gpu", n) for n in self._node_names]
        self._topic_node = [topic_for(site, "node", n) for n in self._node_names]
        self._topic_pdu = [topic_for(site, "pdu", p.name) for p in self._pdus]
        self._topic_cdu = [topic_for(site, "cdu", c.name) for c in self._cdus]
        owners = list(dict.fromkeys(self._link_owner))
        self._link_groups = [
            (o, topic_for(site, "link", o), [i for i, w in enumerate(self._link_owner) if w == o])
            for o in owners
        ]
        self._limit_list = np.round(self._limit, 1).tolist()
        self._mem_clock_list = np.round(self._mem_clock, 0).tolist()

    def _samples(self) -> list[tuple[str, str, str, list[dict[str, Any]]]]:
        """(topic, kind, source, samples) of every message of the latest tick."""
        out: list[tuple[str, str, str, list[dict[str, Any]]]] = []
        m = self._m_gpu
        act = m["activity"]
        util = np.where(act > 0.05, 100.0, np.clip(np.round(act * 1000.0), 0.0, 100.0))
        gpu_samples = [
            {
                "id": gid,
                "power_w": p,
                "temp_c": tc,
                "mem_temp_c": tm,
                "util_pct": u,
                "sm_active": a,
                "energy_j": e,
                "power_limit_w": lim,
                "clock_sm_mhz": clk,
                "clock_mem_mhz": mclk,
                "throttle_reasons": thr,
            }
            for gid, p, tc, tm, u, a, e, lim, clk, mclk, thr in zip(
                self._gpu_ids,
                np.round(m["power"], 1).tolist(),
                np.round(m["temp"], 1).tolist(),
                np.round(m["mem_temp"], 1).tolist(),
                util.tolist(),
                np.round(act, 3).tolist(),
                np.round(self._energy_j, 0).tolist(),
                self._limit_list,
                np.round(m["clock"], 0).tolist(),
                self._mem_clock_list,
                m["throttle"].astype(np.int64).tolist(),
                strict=True,
            )
        ]
        starts = self._gpu_start.tolist()
        for i, name in enumerate(self._node_names):
            out.append((self._topic_gpu[i], "gpu", name, gpu_samples[starts[i] : starts[i + 1]]))

        n = self._m_node
        for name, topic, p, tin, cpu in zip(
            self._node_names,
            self._topic_node,
            np.round(n["power"], 1).tolist(),
            np.round(n["inlet"], 1).tolist(),
            np.round(n["cpu"], 1).tolist(),
            strict=True,
        ):
            out.append(
                (
                    topic,
                    "node",
                    name,
                    [{"id": name, "power_w": p, "inlet_temp_c": tin, "cpu_util_pct": cpu}],
                )
            )

        if self._pdus:
            d = self._m_pdu
            power = np.round(d["power"], 1).tolist()
            energy = np.round(d["energy"], 3).tolist()
            inlet = np.round(d["inlet"], 1).tolist()
            hum = np.round(d["humidity"], 1).tolist()
            freq = np.round(d["freq"], 2).tolist()
            li = np.round(d["line_i"], 2).tolist()
            lp = np.round(d["line_p"], 1).tolist()
            lv = np.round(d["voltage"], 1).tolist()
            pf = np.round(d["pf"], 3).tolist()
            bi = np.round(d["breaker_i"], 2).tolist()
            br_by_pdu: list[list[dict[str, Any]]] = [[] for _ in self._pdus]
            for bid, p_i, cur in zip(self._br_ids, self._br_pdu.tolist(), bi, strict=True):
                br_by_pdu[p_i].append({"id": bid, "current_a": cur})
            for p_i, pdu in enumerate(self._pdus):
                samples: list[dict[str, Any]] = [
                    {
                        "id": pdu.name,
                        "power_w": power[p_i],
                        "energy_kwh": energy[p_i],
                        "inlet_temp_c": inlet[p_i],
                        "humidity_pct": hum[p_i],
                        "frequency_hz": freq[p_i],
                    }
                ]
                for ph in range(pdu.phases):
                    k = 3 * p_i + ph
                    samples.append(
                        {
                            "id": phase_id(pdu.name, ph + 1),
                            "current_a": li[k],
                            "voltage_v": lv[k],
                            "power_w": lp[k],
                            "power_factor": pf[k],
                        }
                    )
                samples.extend(br_by_pdu[p_i])
                out.append((self._topic_pdu[p_i], "pdu", pdu.name, samples))

        if self._cdus:
            c = self._m_cdu
            cols = {
                "supply_temp_c": np.round(c["supply"], 2).tolist(),
                "return_temp_c": np.round(c["return"], 2).tolist(),
                "flow_lpm": np.round(c["flow"], 1).tolist(),
                "dp_kpa": np.round(c["dp"], 1).tolist(),
                "fw_supply_temp_c": np.round(c["fw_supply"], 2).tolist(),
                "fw_return_temp_c": np.round(c["fw_return"], 2).tolist(),
                "fw_flow_lpm": np.round(c["fw_flow"], 1).tolist(),
                "heat_kw": np.round(c["heat"], 2).tolist(),
                "pump_power_w": np.round(c["pump_w"], 1).tolist(),
            }
            speed = np.round(c["pump_speed"] * 100.0, 1).tolist()
            each = np.round(c["pump_each_w"], 1).tolist()
            pumps: list[list[dict[str, Any]]] = [[] for _ in self._cdus]
            for pid, c_i, s, w in zip(
                self._pump_ids, self._pump_cdu.tolist(), speed, each, strict=True
            ):
                pumps[c_i].append({"id": pid, "pump_speed_pct": s, "pump_power_w": w})
            for c_i, cdu in enumerate(self._cdus):
                sample: dict[str, Any] = {"id": cdu.name}
                sample.update({k: v[c_i] for k, v in cols.items()})
                out.append((self._topic_cdu[c_i], "cdu", cdu.name, [sample, *pumps[c_i]]))

        if self._n_links:
            lk = self._m_link
            tx = np.round(lk["tx"], 0).tolist()
            rx = np.round(lk["rx"], 0).tolist()
            err = lk["errors"].tolist()
            for owner, topic, idx in self._link_groups:
                out.append(
                    (
                        topic,
                        "link",
                        owner,
                        [
                            {
                                "id": self._links[i].name,
                                "tx_bps": tx[i],
                                "rx_bps": rx[i],
                                "errors": err[i],
                            }
                            for i in idx
                        ],
                    )
                )
        return out

    # ---- truth ---------------------------------------------------------------------------------

    def _truth(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "start": self.start.isoformat().replace("+00:00", "Z"),
            "rate_hz": self.rate_hz,
            "site": self.site.name,
            "gpus": self._truth_gpus(),
            **self._truth_devices(),
            "fleets": self._truth_fleets(),
            "groups": self._truth_groups(),
            "faults": self._truth_faults(),
        }

    def _truth_gpus(self) -> dict[str, Any]:
        f = _rounded
        gpus: dict[str, Any] = {}
        for i, gid in enumerate(self._gpu_ids):
            entry: dict[str, Any] = {
                "idle_w": f(self._idle[i], 3),
                "limit_w": f(self._limit[i], 3),
                "gamma": f(self._gamma[i]),
                "r_k_per_w": f(self._r[i], 7),
                "c_j_per_k": f(self._c[i], 3),
                "tau_s": f(self._r[i] * self._c[i], 4),
                "mem_r_k_per_w": f(self._mem_r[i], 7),
                "mem_c_j_per_k": f(self._mem_c[i], 3),
                "coolant": "liquid" if self._gpu_liquid[i] else "air",
                "max_operating_temp_c": f(self._max_op_c[i]),
                "slowdown_temp_c": f(self._slowdown_c[i]),
                "fleet": self._fleet_name(int(self._gpu_fleet[i])),
                "activity_share": f(self._gpu_share[i]),
                "group": self._group_name(int(self._gpu_group[i])),
            }
            if self._gpu_liquid[i]:
                entry["cdu"] = self._cdus[int(self._gpu_cdu[i])].name
                entry["coolant_offset_k"] = f(self._coolant_offset[i], 4)
            else:
                entry["rack"] = self._racks[int(self._node_rack[self._gpu_node[i]])].name
            gpus[gid] = entry
        return gpus

    def _truth_devices(self) -> dict[str, Any]:
        """The true parameters of the nodes, racks, CDUs, PDUs and links."""
        f = _rounded
        pdu_names = [p.name for p in self._pdus]
        nodes = {
            n.name: {
                "base_w": f(self._base_w[i], 3),
                "overhead_frac": f(self._overhead[i]),
                "psu_loss_const_w": PSU_LOSS_CONST_W,
                "psu_efficiency": PSU_EFFICIENCY,
                "rack": self._racks[int(self._node_rack[i])].name,
                "fleet": self._fleet_name(int(self._node_fleet[i])),
                "cooling": "liquid" if self._node_liquid[i] else "air",
                "phase": f"L{int(self._node_phase[i]) + 1}",
            }
            for i, n in enumerate(self._nodes)
        }
        racks = {
            r.name: {
                "capture_fraction": f(self._capture[j]),
                "cdu": r.cdu,
                "pdus": list(r.pdus),
                "inlet_air_c": f(self._rack_inlet[j], 4),
                "inlet_daily_swing_k": f(self._rack_swing[j], 4),
                "humidity_pct": f(self._rack_humidity[j], 3),
            }
            for j, r in enumerate(self._racks)
        }
        cdus = {
            c.name: {
                "coolant": c.coolant,
                "capacity_kw": f(self._cdu_capacity[i]),
                "approach_k": f(self._approach[i]),
                "supply_setpoint_c": f(self._cdu_setpoint[i]),
                "fw_supply_temp_c": f(self._fw_base[i]),
                "fw_drift_k": f(self._fw_drift[i], 4),
                "fw_drift_period_s": f(self._fw_period[i], 1),
                "fw_drift_phase_rad": f(self._fw_phase[i]),
                "fw_flow_lpm": f(self._fw_flow[i], 3),
                "max_flow_lpm": f(self._max_flow[i]),
                "design_dp_kpa": f(self._design_dp[i]),
                "shutoff_head_kpa": f(self._h0[i]),
                "pump_k": float(self._kp[i]),
                "system_k": float(self._ks[i]),
                "pump_speed_frac": PUMP_SPEED,
                "pump_rated_power_w": f(self._pump_rated_w[i], 3),
                "return_lag_tau_s": f(self._loop_tau[i], 3),
                "pumps": list(c.pumps),
                "racks": self._cdu_racks[i],
            }
            for i, c in enumerate(self._cdus)
        }
        pdus = {
            name: {
                "wiring": self._pdu_wiring[i],
                "voltage_v": f(self._pdu_vll[i]),
                "rated_current_a": f(self._pdu_rated[i]),
                "power_factor": f(self._pdu_pf[i]),
                "frequency_hz": f(self._pdu_freq[i]),
            }
            for i, name in enumerate(pdu_names)
        }
        links = {
            link.name: {
                "a": link.a,
                "b": link.b,
                "source": self._link_owner[i],
                "capacity_bps": f(self._link_capacity_bps[i], 1),
                "background_bps": [
                    f(self._link_background[2 * i], 1),
                    f(self._link_background[2 * i + 1], 1),
                ],
            }
            for i, link in enumerate(self._links)
        }
        return {"nodes": nodes, "racks": racks, "cdus": cdus, "pdus": pdus, "links": links}

    def _truth_groups(self) -> dict[str, dict[str, Any]]:
        f = _rounded
        groups: dict[str, dict[str, Any]] = {}
        for k, name in enumerate(self._group_names):
            f_i = int(self._group_fleet[k])
            e = {
                "fleet": self._fleets[f_i].name,
                "role": self._fleets[f_i].role,
                "nodes": [
                    n.name for n, gk in zip(self._nodes, self._node_group, strict=True) if gk == k
                ],
            }
            if self._group_training[k]:
                e.update(
                    level=f(self._train_level[k]),
                    step_s=f(self._step_s[k], 4),
                    allreduce_bytes_per_node=float(
                        network.allreduce_bytes_per_rank(
                            TRAIN_PARAMS * GRAD_BYTES, int(self._group_nodes[k])
                        )
                    ),
                )
            else:
                e.update(load_share=f(self._group_share[k]))
            groups[name] = e
        return groups

    def _truth_fleets(self) -> dict[str, Any]:
        f = _rounded
        fleets = {}
        for i, fl in enumerate(self._fleets):
            e = {
                "role": fl.role,
                "nodes": int(self._fleet_nodes[i]),
                "groups": [
                    g
                    for g, gf in zip(self._group_names, self._group_fleet, strict=False)
                    if gf == i
                ],
            }
            if fl.role == "training":
                e.update(
                    run_s=list(TRAIN_RUN_S),
                    gap_s=list(TRAIN_GAP_S),
                    ramp_s=list(TRAIN_RAMP_S),
                    checkpoint_period_s=CHECKPOINT_PERIOD_S,
                    checkpoint_duration_s=CHECKPOINT_DURATION_S,
                    checkpoint_activity=CHECKPOINT_ACTIVITY,
                    model_params=TRAIN_PARAMS,
                    gradient_bytes=TRAIN_PARAMS * GRAD_BYTES,
                )
            else:
                e.update(
                    base_activity=f(self._infer_base[i]),
                    amplitude=f(self._infer_amp[i]),
                    peak_hour_utc=f(self._infer_peak[i], 4),
                    weekend_factor=f(self._infer_weekend[i]),
                    run_s=list(INFER_RUN_S),
                    gap_s=list(INFER_GAP_S),
                    ramp_s=list(INFER_RAMP_S),
                )
            fleets[fl.name] = e
        return fleets

    def _truth_faults(self) -> list[dict[str, Any]]:
        faults = []
        for i, fault in enumerate(self.faults):
            d = fault.model_dump()
            d["spec"] = str(fault)
            d["effective_magnitude"] = self._fault_value[i]
            d["magnitude_unit"] = {
                "cold_plate": "R multiplier - 1",
                "cold_plate_decay": "R multiplier - 1 (reached at the end of the ramp)",
                "pump_failure": None,
                "phase_overload": "W",
                "phase_creep": "W (reached at the end of the ramp)",
                "fleet_idle": "activity",
            }[fault.kind]
            faults.append(d)
        return faults

    def _fleet_name(self, slot: int) -> str | None:
        return self._fleets[slot].name if slot < len(self._fleets) else None

    def _group_name(self, slot: int) -> str | None:
        return self._group_names[slot] if slot < len(self._group_names) else None


def _rounded(x: Any, nd: int = 6) -> float:
    """``x`` as a float rounded to ``nd`` decimals (the truth file's numbers)."""
    return round(float(x), nd)
