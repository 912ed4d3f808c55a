"""A bundle on its time grid for the what-if: float32 (T, N) arrays, one row group at a time.

Bundles are sorted by (id, ts) and written in row groups (``twin.replay.bundle``), so the grid
is filled one row group at a time and no whole-table copy of a 10,000-GPU day is ever held.
Samples missing from the grid hold the last value (``hold_fill``), backfilled at the start.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from collectors.contract import sub_id
from twin.blocks import in_order
from twin.chain import ChainParams, PhaseTable, phase_table, pumps_running, resolve
from twin.chain.propagate import link_busy_gbps, rack_sum_w
from twin.replay.bundle import Bundle
from twin.site import Site
from twin.site.index import SiteIndex, index_site, node_inlet_c
from twin.store.windows import hold_fill

F32 = np.float32


@dataclass
class Recording:
    """The recording on its time grid, the site flattened, the chain's parameters resolved."""

    bundle: Bundle
    site: Site
    t0: datetime
    dt_s: float
    n: int
    idx: SiteIndex
    params: ChainParams
    phases: PhaseTable
    gpu_power_w: np.ndarray  # (T, G) float32
    gpu_temp_c: np.ndarray  # (T, G) float32; NaN columns: a GPU that never reported
    gpu_activity: np.ndarray  # (T, G) float32: SM activity, else utilization / 100
    gpu_power_limit_w: np.ndarray  # (G,) the enforced limit (the catalog's where none)
    node_inlet_c: np.ndarray  # (T, nodes)
    pdu_power_w: np.ndarray  # (T, PDUs), site.pdus order
    pdu_pf: np.ndarray  # (PDUs,) mean measured power factor (NaN: none)
    # Gaps are held (the value before, else after); a device (or quantity) with no reading in
    # the whole recording stays NaN, unknown as the live pass has it: a phase current, a CDU's
    # readings, a link's traffic, a rack whose feeds do not all report
    phase_current_a: np.ndarray  # (T, phases), ``phases.ids`` order
    cdu: dict[str, np.ndarray]  # supply_temp_c, return_temp_c, flow_lpm, heat_kw, fw_supply...
    #: cdu name -> (T, pumps) bool: running, or no speed reading (as live: not claimed stopped)
    pump_on: dict[str, np.ndarray]
    link_busy_gbps: np.ndarray  # (T, links): the busier direction
    rack_in_w: np.ndarray  # (T, racks) rack input power: the sum of its PDUs (feeds)
    #: (T, racks) IT load: the sum of the rack's nodes' input power (gaps held; NaN for a rack
    #: without nodes or with a node that never reported); the load the live headroom's
    #: persistence p90 and phase trend take where every node reports ("rack.it" fresh)
    rack_it_w: np.ndarray
    cache: dict[str, Any] = field(default_factory=dict)
    #: (G,) True where ``gpu_activity`` is GPU-Util (no SM activity recorded): those GPUs'
    #: power may follow a curve calibrated on util (twin.chain.propagate.gpu_power_w)
    gpu_activity_from_util: np.ndarray | None = None
    #: (G,) False where the GPU reported neither SM activity nor GPU-Util in the recording
    #: (``gpu_activity`` holds 0 there): a forecast scales its power, as the live one does
    gpu_activity_reported: np.ndarray | None = None
    #: (T, C) False where none of a CDU's pumps has a fresh speed reading (live: no pump count)
    cdu_pumps_reported: np.ndarray | None = None
    #: (T, N) bool per reading: one within the live pass's "now" window (:data:`FRESH_S`) at
    #: each step; where not, the held value feeds the model but is no headroom figure, as live
    #: keys "cdu.<quantity>", "phase.current_a", "link.busy", "rack.power" (every feed fresh),
    #: "node.inlet_temp_c" (its own or its rack's PDU's)
    fresh: dict[str, np.ndarray] = field(default_factory=dict)
    #: (T, N) bool: a reading at that very step (not held), for the minute means the live pass
    #: takes over actual readings: "cdu.<quantity>", "node.inlet_temp_c"
    reading: dict[str, np.ndarray] = field(default_factory=dict)
    #: "temp_c", "power_w" -> (the GPUs with a gap in it, (T, k) where it is fresh there)
    gpu_fresh: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def gpu_told(self, quantity: str, cols: slice) -> np.ndarray | None:
        """(T, cols) where GPUs ``cols`` have a fresh ``quantity`` reading (None: everywhere)."""
        gappy, told_k = self.gpu_fresh.get(quantity, (np.zeros(0, np.int64), None))
        k = np.flatnonzero((gappy >= cols.start) & (gappy < cols.stop))
        if not k.size or told_k is None:
            return None
        told = np.ones((self.n, cols.stop - cols.start), bool)
        told[:, gappy[k] - cols.start] = told_k[:, k]
        return told

    @property
    def duration_s(self) -> float:
        return self.n * self.dt_s

    def times(self) -> list[datetime]:
        from datetime import timedelta

        return [self.t0 + timedelta(seconds=k * self.dt_s) for k in range(self.n)]


def grid(
    bundle: Bundle,
    kind: str,
    ids: list[str],
    quantities: list[str],
    t0: datetime,
    dt_s: float,
    n: int,
    *,
    per_id_max: tuple[str, ...] = (),
) -> dict[str, np.ndarray]:
    """(T, N) float32 arrays of ``quantities`` for ``ids`` on the grid (NaN: no sample), and
    for each of ``per_id_max`` the (N,) largest sample of each id on the grid (NaN: none),
    without a grid of it."""
    out: dict[str, np.ndarray] = {q: np.full(len(ids), np.nan) for q in per_id_max}
    path = bundle.path / f"{kind}.parquet"
    res = bundle.manifest.resolutions.get(kind, {})
    f = pq.ParquetFile(path) if kind in bundle.manifest.rows and path.is_file() else None
    # a quantity with no sample in the whole file is not read (all NaN)
    present = [q for q in (*quantities, *per_id_max) if f is not None and _has_values(f, q)]
    present = [q for q in present if q in res]

    # the NaN fill is most of the first touch of the grid's pages: a core each (10,016 GPUs:
    # three arrays of 0.35 GB)
    def nan_grid(_: str) -> np.ndarray:
        return np.full((n, len(ids)), np.nan, dtype=F32)

    out |= dict(zip(quantities, in_order(nan_grid, quantities), strict=True))
    if f is None or not present:
        return out
    pos = {s: i for i, s in enumerate(ids)}
    start_us = int(t0.timestamp() * 1e6)
    n_groups = f.num_row_groups

    def decode(rg: int) -> tuple[_Placement, dict[str, np.ndarray]]:
        """A row group's placement on the (T, N) grid and its values, scaled, as float32 (a
        reader per call: two threads never share one)."""
        t = pq.ParquetFile(path, read_dictionary=["id"]).read_row_group(
            rg, columns=["ts", "id", *present]
        )
        col = np.full(t.num_rows, -1, dtype=np.int64)
        at = 0
        for chunk in t.column("id").chunks:
            lut = np.array([pos.get(s, -1) for s in chunk.dictionary.to_pylist()], np.int64)
            k = len(chunk)
            col[at : at + k] = lut[chunk.indices.to_numpy(zero_copy_only=False)]
            at += k
        place = _placement(_epoch_us(t.column("ts")), col, start_us, dt_s, n, len(ids))
        values = {}
        for q in present:
            v = t.column(q).to_numpy(zero_copy_only=False)
            scale = res.get(q)
            values[q] = v.astype(F32) if scale is None else (v * scale).astype(F32)
        return place, values

    def write(place: _Placement, values: dict[str, np.ndarray], qs: list[str]) -> None:
        for q in qs:  # slice assignment and np.put release the GIL
            place.write(out[q], values[q])

    # row groups decoded a core each and written in file order (a later sample of a cell wins);
    # a group's quantities written half here, half on a thread of their own
    gridded = [q for q in present if q in quantities]
    mine, theirs = gridded[::2], gridded[1::2]
    with ThreadPoolExecutor(1, thread_name_prefix="dctwin-grid") as writer:
        for place, values in in_order(decode, range(n_groups)):
            other = writer.submit(write, place, values, theirs)
            write(place, values, mine)
            for q in per_id_max:
                if q in values:
                    place.fmax(out[q], values[q])
            other.result()  # the group is written before the next one's writes start
    return out


def _has_values(f: pq.ParquetFile, column: str) -> bool:
    """Whether ``column`` of ``f`` may hold a value (False only where every row group's
    statistics say all its rows are null)."""
    names = f.schema_arrow.names
    if column not in names:
        return False
    i = names.index(column)
    md = f.metadata
    for rg in range(md.num_row_groups):
        st = md.row_group(rg).column(i).statistics
        if st is None or not st.has_null_count or st.null_count < md.row_group(rg).num_rows:
            return True
    return False


@dataclass
class _Placement:
    """Where a row group's rows land on the flattened (T, N) grid: as blocks of columns whose
    rows are consecutive steps (a bundle is sorted by (id, ts), so a GPU's day is a run; runs
    of neighbouring columns over the same steps are one block, written as a transposed
    slice), else as one flat index per row."""

    n_cols: int
    #: (k, 5) int64: first row, rows, first column, columns, first source row
    blocks: np.ndarray | None = None
    flat: np.ndarray | None = None  # (rows,) flat index of each kept source row
    keep: np.ndarray | None = None  # (rows,) bool: the source rows that land (None: all)

    def write(self, grid: np.ndarray, v: np.ndarray) -> None:
        if self.blocks is None:
            np.put(grid, self.flat, v if self.keep is None else v[self.keep])
            return
        for r0, rows, c0, cols, s0 in self.blocks.tolist():
            grid[r0 : r0 + rows, c0 : c0 + cols] = v[s0 : s0 + rows * cols].reshape(cols, rows).T

    def fmax(self, acc: np.ndarray, v: np.ndarray) -> None:
        """``acc`` (N,) = the larger of it and each column's samples here (NaN ignored)."""
        if self.blocks is None:
            np.fmax.at(acc, self.flat % self.n_cols, v if self.keep is None else v[self.keep])
            return
        for _r0, rows, c0, cols, s0 in self.blocks.tolist():
            part = v[s0 : s0 + rows * cols].reshape(cols, rows)
            with np.errstate(all="ignore"):
                np.fmax(acc[c0 : c0 + cols], np.fmax.reduce(part, axis=1), out=acc[c0 : c0 + cols])


def _placement(
    ts_us: np.ndarray, col: np.ndarray, start_us: int, dt_s: float, n: int, n_cols: int
) -> _Placement:
    """A row group's :class:`_Placement` (``col``: each row's column, -1 for an id not on
    the grid)."""
    step_us = dt_s * 1e6
    if ts_us.size and step_us == round(step_us):
        # runs: the same column at consecutive steps
        brk = np.flatnonzero((col[1:] != col[:-1]) | (np.diff(ts_us) != int(step_us))) + 1
        if brk.size < ts_us.size // 16:  # else too short to be worth a slice each
            s0 = np.concatenate(([0], brk))
            rows = np.diff(np.append(s0, ts_us.size))
            c = col[s0]
            r0 = np.rint((ts_us[s0] - start_us) / step_us).astype(np.int64)
            lo = np.clip(-r0, 0, rows)  # clipped to the grid's rows
            hi = np.clip(n - r0, lo, rows)
            ok = (c >= 0) & (hi > lo)
            s0, r0, rows, c = (s0 + lo)[ok], (r0 + lo)[ok], (hi - lo)[ok], c[ok]
            # runs of neighbouring columns over the same rows, contiguous in the source
            joined = np.zeros(len(s0), bool)
            joined[1:] = (
                (c[1:] == c[:-1] + 1)
                & (r0[1:] == r0[:-1])
                & (rows[1:] == rows[:-1])
                & (s0[1:] == s0[:-1] + rows[:-1])
            )
            first = np.flatnonzero(~joined)
            cols = np.diff(np.append(first, len(s0)))
            blocks = np.column_stack([r0[first], rows[first], c[first], cols, s0[first]])
            return _Placement(n_cols, blocks=blocks.astype(np.int64))
    row = np.rint((ts_us - start_us) / step_us).astype(np.int64)
    keep = (col >= 0) & (row >= 0) & (row < n)
    flat = row * n_cols + col  # one index into the flattened (T, N) grid
    if keep.all():
        return _Placement(n_cols, flat=flat)
    return _Placement(n_cols, flat=flat[keep], keep=keep)


def _epoch_us(ts: pa.ChunkedArray) -> np.ndarray:
    """Microseconds since the epoch of a timestamp column, as int64, cast in Arrow (0.4 ms per
    million rows, against 21 ms through to_numpy's datetime64: 2 s of CPU in the read of a
    10,016-GPU bundle's 86.5 million rows)."""
    tz = ts.type.tz if pa.types.is_timestamp(ts.type) else None
    # safe=False: sub-microsecond digits are dropped, as datetime64[us] drops them
    return ts.cast(pa.timestamp("us", tz=tz), safe=False).cast(pa.int64()).to_numpy()


#: A reading older than this is not "now": the live headroom's window (twin.analysis.headroom). [s]
FRESH_S = 60.0


def fresh(raw: np.ndarray, dt_s: float) -> np.ndarray:
    """(T, N) bool: a reading in the last :data:`FRESH_S` of each step (``raw``: the grid
    before its gaps are held)."""
    told = np.ones(raw.shape, bool)
    gappy = np.flatnonzero(np.isnan(raw).any(axis=0))  # the columns with a gap: few, mostly
    if gappy.size:
        w = max(1, round(FRESH_S / dt_s))
        seen = np.cumsum(~np.isnan(raw[:, gappy]), axis=0, dtype=np.int32)
        before = np.zeros_like(seen)
        before[w:] = seen[:-w]
        told[:, gappy] = seen > before
    return told


def _filled(a: np.ndarray) -> np.ndarray:
    """``a`` with its gaps held (``hold_fill``); ``a`` itself (float32) when it has none."""
    if not np.isnan(a).any():
        return a.astype(F32, copy=False)
    return hold_fill(a, backfill=True).astype(F32, copy=False)


def _finite(a: np.ndarray, nan: float = 0.0) -> np.ndarray:
    """``np.nan_to_num(a, nan=nan)`` in place (``a`` is a fresh grid of :func:`load`), without
    a pass when everything is finite already."""
    if np.isfinite(a).all():
        return a
    return np.nan_to_num(a, copy=False, nan=nan)


def load(bundle: Bundle) -> Recording:
    """Read a bundle onto its time grid and resolve the chain's parameters for its site."""
    m = bundle.manifest
    dt = m.resolution_s or 1.0
    n = round((m.end - m.start).total_seconds() / dt)
    site = bundle.site
    idx = index_site(site)
    t0 = m.start
    g = grid(
        bundle,
        "gpu",
        idx.gpu_ids,
        ["power_w", "temp_c", "sm_active"],
        t0,
        dt,
        n,
        per_id_max=("power_limit_w",),
    )
    act = g["sm_active"]
    no_sm = np.isnan(act).all(axis=0)
    if no_sm.any():  # GPU-Util read for the GPUs without SM activity only
        some = [gid for gid, no in zip(idx.gpu_ids, no_sm, strict=True) if no]
        act[:, no_sm] = grid(bundle, "gpu", some, ["util_pct"], t0, dt, n)["util_pct"] / F32(100)
    reported = ~np.isnan(act).all(axis=0)
    plim = g.pop("power_limit_w")
    params = resolve(site, idx, bundle.params())
    plim = np.where(np.isfinite(plim) & (plim > 0), plim, params.gpu.limit_w)
    act = _finite(_filled(act))
    np.clip(act, 0.0, 1.0, out=act)
    node_q = ["inlet_temp_c", "power_w"]
    node = grid(bundle, "node", [nd.name for nd in site.nodes], node_q, t0, dt, n)
    phases = phase_table(site)
    pdu_names = [p.name for p in site.pdus]
    pdu = grid(bundle, "pdu", pdu_names, ["power_w", "power_factor", "inlet_temp_c"], t0, dt, n)
    cur = grid(bundle, "pdu", phases.ids, ["current_a"], t0, dt, n)["current_a"]
    cdu_q = ["supply_temp_c", "return_temp_c", "flow_lpm", "heat_kw", "fw_supply_temp_c"]
    cdu = grid(bundle, "cdu", idx.cdu_names, cdu_q, t0, dt, n)
    pump_ids = [sub_id(c.name, p) for c in site.cdus for p in c.pumps]
    speeds = grid(bundle, "cdu", pump_ids, ["pump_speed_pct"], t0, dt, n)["pump_speed_pct"]
    pump_on: dict[str, np.ndarray] = {}
    pumps_reported = np.zeros((n, len(site.cdus)), bool)
    k = 0
    for i, c in enumerate(site.cdus):
        raw = speeds[:, k : k + len(c.pumps)]
        told = fresh(raw, dt)  # a pump without a fresh reading is not claimed stopped
        pump_on[c.name] = pumps_running(_filled(raw)) | ~told
        pumps_reported[:, i] = told.any(axis=1)
        k += len(c.pumps)
    link = grid(bundle, "link", [lk.name for lk in site.links], ["tx_bps", "rx_bps"], t0, dt, n)
    link_raw = link_busy_gbps(link["tx_bps"], link["rx_bps"]).astype(F32)
    busy = _filled(link_raw)
    pdu_w = _filled(pdu["power_w"])
    # a node without inlet readings: its rack's PDU's, as the live reference takes it
    nodes = [nd.name for nd in site.nodes]
    inlet = node_inlet_c(idx, nodes, node["inlet_temp_c"], pdu_names, pdu["inlet_temp_c"])
    # a rack with a feed that never reported has no known load (gaps are held, so only such a
    # feed is NaN); its load is fresh where every feed is
    r_pdus = [r.pdus for r in site.racks]
    rack_in = rack_sum_w(pdu_w, pdu_names, r_pdus, every_member=True)
    feed_fresh = np.where(fresh(pdu["power_w"], dt), 0.0, np.nan)
    rack_fresh = np.isfinite(rack_sum_w(feed_fresh, pdu_names, r_pdus, every_member=True))
    # each rack's IT load, its nodes' summed (a node that never reported: unknown), and where
    # every node has a fresh reading (the live pass's condition for taking the nodes' sum)
    r_nodes = [[nd.name for nd in r.nodes] for r in site.racks]
    node_w = _filled(node["power_w"]).astype(float)
    rack_it = rack_sum_w(node_w, nodes, r_nodes, every_member=True)
    node_fresh = np.where(fresh(node["power_w"], dt), 0.0, np.nan)
    it_fresh = np.isfinite(rack_sum_w(node_fresh, nodes, r_nodes, every_member=True))
    told = {f"cdu.{q}": fresh(v, dt) for q, v in cdu.items()}
    told |= {"phase.current_a": fresh(cur, dt), "link.busy": fresh(link_raw, dt)}
    told["rack.power"] = rack_fresh
    told["rack.it"] = it_fresh
    told["node.inlet_temp_c"] = fresh(inlet, dt)
    reading = {f"cdu.{q}": ~np.isnan(v) for q, v in cdu.items()}
    reading["node.inlet_temp_c"] = ~np.isnan(inlet)
    gpu_fresh = {}
    for q in ("temp_c", "power_w"):  # the gappy GPUs only: a (T, G) mask would be GBs
        gappy = np.flatnonzero(np.isnan(g[q]).any(axis=0))
        gpu_fresh[q] = (gappy, fresh(g[q][:, gappy], dt))
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            pf = np.nanmean(pdu["power_factor"], axis=0).astype(float)
    return Recording(
        bundle=bundle,
        site=site,
        t0=t0,
        dt_s=dt,
        n=n,
        idx=idx,
        params=params,
        phases=phases,
        gpu_power_w=_finite(_filled(g["power_w"])),
        gpu_temp_c=_filled(g["temp_c"]),
        gpu_activity=act,
        gpu_power_limit_w=plim,
        node_inlet_c=_finite(_filled(inlet), nan=25.0),
        pdu_power_w=pdu_w,
        pdu_pf=pf,
        phase_current_a=_filled(cur),
        cdu={q: _filled(v).astype(float) for q, v in cdu.items()},
        pump_on=pump_on,
        link_busy_gbps=busy,
        rack_in_w=rack_in,
        rack_it_w=rack_it,
        gpu_activity_from_util=no_sm,
        gpu_activity_reported=reported,
        cdu_pumps_reported=pumps_reported,
        fresh=told,
        reading=reading,
        gpu_fresh=gpu_fresh,
    )
