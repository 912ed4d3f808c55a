"""Generate a large, valid site file: ``dctwin site generate --gpus 100000 --halls 4``.

The site is what a 2026 AI campus looks like at the level the twin sees it:

* GB200 NVL72 racks (18 ``GB200-NVL72-TRAY`` compute trays, 72 GPUs) and HGX racks (four
  ``HGX-H200-8-DLC`` nodes, 32 GPUs; the last HGX rack of a hall may hold fewer), all liquid
  cooled, in rows of ``racks_per_row`` racks of one kind, spread evenly over the halls;
* per rack an A and a B PDU (3-phase 415 V wye, one branch breaker per phase), each sized to
  carry the whole rack at its design load on its worst phase (2N: one feed can fail), at 80 %
  continuous derating, rounded up to a preferred rating;
* per row one TCS loop of catalog row CDUs, N+1 on the row's heat to liquid at design load,
  racks served round-robin;
* per row one leaf switch with a link from every node (one 400 Gb/s NIC per GPU) and one uplink to
  every spine of its hall (non-blocking); per hall ``spines_per_hall`` spines; spines of
  neighbouring halls linked (4:1 oversubscribed between halls);
* training and inference fleets: ``inference_share`` of each hall's racks of each kind serve
  inference, the rest train; fleets are runs of adjacent racks of seeded sizes, none across
  two shards.

Design load of a node: every GPU at its TDP through :func:`twin.chain.propagate.node_input_w`
(the chain's own node model, PSU losses included). The same seed gives the same file, byte for
byte. With ``shards`` > 0 the file has a ``shards:`` section (the agreed interface of issue 17):
whole halls per shard when there are at most as many shards as halls, else halls split by rows;
every spine, every link between two shards and every CDU that serves no rack (the standby of a
short row) is in exactly one shard's ``owns``.

The site is built as a mapping, validated with the site model (the ``shards`` section too once
the model has it), and written as YAML directly: block style down to the racks, one flow mapping
a line below. PyYAML's emitter and parser would take most of the time at 100,000 GPUs; the tests
load generated files with the normal loader and compare them with the validated model.
"""

from __future__ import annotations

import json
import math
import re
import string
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from twin.chain.propagate import node_input_w
from twin.site.catalog import ASSUMPTIONS, CDU_MODELS, GPU_MODELS, NODE_MODELS
from twin.site.model import Site

__all__ = ["GenerateOptions", "GeneratedSite", "design_node_w", "generate_site", "to_yaml"]

NVL72_TRAY = "GB200-NVL72-TRAY"
NVL72_TRAYS = 18  # GB200 NVL72: 18 compute trays of 4 GPUs per rack (docs/physics.md §1.4, S)
HGX_NODE = "HGX-H200-8-DLC"
HGX_NODES_PER_RACK = 4  # 4 x 8.2 kW DLC nodes per rack, as the demo site (L)
ROW_CDU = "ROW-CDU-1500"
PDU_VOLTAGE_V = 415.0  # 3-phase 415 V wye, 240 V outlets, as the shipped sites (docs/physics.md §4)
# IEC 60059 preferred current ratings (R10 series), the steps breakers and PDUs are sold in.
PREFERRED_RATINGS_A = (16, 20, 25, 32, 40, 50, 63, 80, 100, 125, 160, 200, 250, 315, 400, 500, 630)
NIC_GBPS_PER_GPU = 400.0  # one ConnectX-7 400 Gb/s NIC per GPU on the scale-out fabric (S)
INTER_HALL_OVERSUBSCRIPTION = 4.0  # hall-to-hall spine links carry 1/4 of a hall's uplink (L)
PHASES = ("L1", "L2", "L3")
_PLAIN = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-/]*$")


class GenerateOptions(BaseModel):
    """What ``dctwin site generate`` builds."""

    model_config = ConfigDict(extra="forbid")

    gpus: int = Field(gt=0, description="GPUs in the site (rounded to a multiple of 8)")
    halls: int = Field(1, ge=1, le=26 * 27, description="halls (hall-a, hall-b, ...)")
    nvl72_share: float = Field(0.5, ge=0, le=1, description="share of GPUs in GB200 NVL72 racks")
    inference_share: float = Field(0.3, ge=0, le=1, description="share of racks serving inference")
    seed: int = Field(0, ge=0, description="same seed, same file")
    shards: int = Field(0, ge=0, description="shards in the shards: section; 0: no section")
    racks_per_row: int = Field(16, ge=1, le=99)
    spines_per_hall: int = Field(4, ge=1, le=64)
    name: str = Field("gen", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$", description="site name")
    api_port: int = Field(8421, ge=1, le=65535, description="first shard's api_url port")


@dataclass
class GeneratedSite:
    """The YAML text, the validated model (without the shards section) and a summary."""

    text: str
    site: Site
    summary: dict[str, Any]
    notes: list[str] = field(default_factory=list)


@dataclass
class _Rack:
    name: str
    kind: str  # "nvl72" | "hgx"
    nodes: list[str]
    role: str = "training"
    cdu: str = ""


@dataclass
class _Row:
    hall: str
    name: str
    kind: str
    racks: list[_Rack]
    cdus: list[str] = field(default_factory=list)

    @property
    def path(self) -> str:
        return f"{self.hall}/{self.name}"

    @property
    def gpus(self) -> int:
        return sum(len(r.nodes) * NODE_MODELS[_model(r.kind)].gpus for r in self.racks)


def _model(kind: str) -> str:
    return NVL72_TRAY if kind == "nvl72" else HGX_NODE


def _hall_letter(i: int) -> str:
    letters = string.ascii_lowercase
    return letters[i] if i < 26 else letters[i // 26 - 1] + letters[i % 26]


def _split(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` integers that differ by at most one, larger first."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _rating_a(current_a: float) -> float:
    """The smallest preferred rating whose 80 % continuous limit carries ``current_a``."""
    need = current_a / ASSUMPTIONS.continuous_load_factor
    for r in PREFERRED_RATINGS_A:
        if r >= need:
            return float(r)
    raise ValueError(f"a phase of {current_a:.0f} A is beyond the largest PDU rating")


def design_node_w(model: str) -> float:
    """Input power of one node with every GPU at its TDP [W] (the chain's node model)."""
    spec = NODE_MODELS[model]
    return float(node_input_w(np.array([GPU_MODELS[spec.gpu].tdp_w]), spec)[0])


def _layout(o: GenerateOptions, gpus: int, rng: np.random.Generator) -> list[list[_Row]]:
    """Racks and rows per hall."""
    n_nvl = round(gpus * o.nvl72_share / (NVL72_TRAYS * 4))
    n_nvl = min(n_nvl, gpus // (NVL72_TRAYS * 4))
    hgx_nodes = (gpus - n_nvl * NVL72_TRAYS * 4) // NODE_MODELS[HGX_NODE].gpus
    halls: list[list[_Row]] = []
    per_hall = zip(_split(n_nvl, o.halls), _split(hgx_nodes, o.halls), strict=True)
    for h, (nvl, hgx) in enumerate(per_hall):
        letter = _hall_letter(h)
        hall = f"hall-{letter}"
        by_kind: dict[str, list[_Rack]] = {"nvl72": [], "hgx": []}
        for k in range(nvl):
            name = f"{letter}-g{k + 1:03d}"
            trays = [f"{name}-t{t + 1:02d}" for t in range(NVL72_TRAYS)]
            by_kind["nvl72"].append(_Rack(name, "nvl72", trays))
        for k in range(math.ceil(hgx / HGX_NODES_PER_RACK)):
            name = f"{letter}-h{k + 1:03d}"
            n = min(HGX_NODES_PER_RACK, hgx - k * HGX_NODES_PER_RACK)
            by_kind["hgx"].append(_Rack(name, "hgx", [f"{name}-n{i + 1}" for i in range(n)]))
        for racks in by_kind.values():  # the last racks of each kind serve inference
            n_inf = round(len(racks) * o.inference_share)
            for r in racks[len(racks) - n_inf :]:
                r.role = "inference"
        rows = [
            (kind, racks[i : i + o.racks_per_row])
            for kind, racks in by_kind.items()
            for i in range(0, len(racks), o.racks_per_row)
        ]
        order = rng.permutation(len(rows))  # the seed decides where each kind's rows stand
        halls.append(
            [
                _Row(hall, f"row-{j + 1:02d}", rows[i][0], rows[i][1])
                for j, i in enumerate(order.tolist())
            ]
        )
    return halls


def _fleets(
    halls: list[list[_Row]], rng: np.random.Generator, part_of: dict[str, int]
) -> list[tuple[str, str, list[str]]]:
    """(name, role, rack names): runs of adjacent racks of one kind and role, seeded sizes; no
    fleet crosses from one part of a hall (``part_of``: a row's shard) to another."""
    out: list[tuple[str, str, list[str]]] = []
    sizes = {"training": (4, 17), "inference": (2, 9)}  # racks per fleet, [low, high)
    for rows in halls:
        letter = rows[0].hall.removeprefix("hall-")
        count = {"training": 0, "inference": 0}
        parts = list(dict.fromkeys(part_of[r.path] for r in rows))
        for kind in ("nvl72", "hgx"):
            for role in ("training", "inference"):
                for part in parts:
                    racks = [
                        r.name
                        for row in rows
                        if row.kind == kind and part_of[row.path] == part
                        for r in row.racks
                        if r.role == role
                    ]
                    i = 0
                    while i < len(racks):
                        n = int(rng.integers(*sizes[role]))
                        count[role] += 1
                        prefix = "trn" if role == "training" else "inf"
                        name = f"{prefix}-{letter}-{count[role]:02d}"
                        out.append((name, role, racks[i : i + n]))
                        i += n
    return out


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(float(x), 3)


def _power(halls: list[list[_Row]]) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """The PDUs and each rack's design load [W]."""
    pf = ASSUMPTIONS.power_factor
    v_phase = PDU_VOLTAGE_V / math.sqrt(3.0)
    pdus: list[dict[str, Any]] = []
    design: dict[str, float] = {}
    node_w = {kind: design_node_w(_model(kind)) for kind in ("nvl72", "hgx")}
    for rows in halls:
        for row in rows:
            for rack in row.racks:
                design[rack.name] = node_w[rack.kind] * len(rack.nodes)
                per_phase = [0.0, 0.0, 0.0]
                for i in range(len(rack.nodes)):
                    per_phase[i % 3] += node_w[rack.kind]
                amps = _num(_rating_a(max(per_phase) / (v_phase * pf)))  # 2N: one feed carries all
                for feed in ("a", "b"):
                    pdus.append(
                        {
                            "name": f"pdu-{rack.name}-{feed}",
                            "feed": feed.upper(),
                            "phases": 3,
                            "wiring": "wye",
                            "voltage_v": _num(PDU_VOLTAGE_V),
                            "rated_current_a": amps,
                            "breakers": [
                                {"name": f"cb{k + 1}", "phase": ph, "rated_current_a": amps}
                                for k, ph in enumerate(PHASES)
                            ],
                        }
                    )
    return pdus, design


def _cooling(halls: list[list[_Row]], design: dict[str, float]) -> list[dict[str, Any]]:
    """Per row one loop of N+1 row CDUs; assigns each rack its CDU."""
    spec = CDU_MODELS[ROW_CDU]
    cdus: list[dict[str, Any]] = []
    for rows in halls:
        for row in rows:
            heat_kw = [
                design[r.name] / 1e3 * NODE_MODELS[_model(r.kind)].capture_fraction
                for r in row.racks
            ]
            n = math.ceil(sum(heat_kw) / spec.capacity_kw) + 1  # N+1 CDUs on the loop
            while max(sum(heat_kw[i::n]) for i in range(n)) > spec.capacity_kw:
                n += 1  # each CDU's round-robin share must fit it
            tag = f"{row.hall.removeprefix('hall-')}-{row.name.removeprefix('row-')}"
            names = [f"cdu-{tag}-{k + 1}" for k in range(n)]
            row.cdus = names
            for k, rack in enumerate(row.racks):
                rack.cdu = names[k % n]
            cdus += [{"name": c, "model": ROW_CDU, "loop": f"loop-{tag}"} for c in names]
    return cdus


def _leaf(row: _Row) -> str:
    return f"leaf-{row.hall.removeprefix('hall-')}-{row.name.removeprefix('row-')}"


def _spines(o: GenerateOptions, h: int) -> list[str]:
    return [f"spine-{_hall_letter(h)}{s + 1}" for s in range(o.spines_per_hall)]


def _network(
    o: GenerateOptions, halls: list[list[_Row]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Switches and links."""
    switches: list[dict[str, Any]] = []
    links: list[dict[str, Any]] = []
    hall_gbps: list[float] = []
    for h, rows in enumerate(halls):
        spines = _spines(o, h)
        switches += [{"name": s, "role": "spine"} for s in spines]
        total = 0.0
        for row in rows:
            leaf = _leaf(row)
            switches.append({"name": leaf, "role": "leaf", "rack": row.racks[0].name})
            for rack in row.racks:
                gbps = _num(NODE_MODELS[_model(rack.kind)].gpus * NIC_GBPS_PER_GPU)
                links += [
                    {"name": f"lnk-{n}", "a": n, "b": leaf, "capacity_gbps": gbps}
                    for n in rack.nodes
                ]
            up = _num(row.gpus * NIC_GBPS_PER_GPU / len(spines))  # non-blocking uplinks
            total += row.gpus * NIC_GBPS_PER_GPU
            links += [
                {"name": f"lnk-{leaf}-{s}", "a": leaf, "b": s, "capacity_gbps": up} for s in spines
            ]
        hall_gbps.append(total)
    n = len(halls)
    for h in range(n if n > 2 else n - 1):  # a ring of halls (one pair for two halls)
        g = (h + 1) % n
        cap = min(hall_gbps[h], hall_gbps[g]) / INTER_HALL_OVERSUBSCRIPTION / o.spines_per_hall
        for a, b in zip(_spines(o, h), _spines(o, g), strict=True):
            links.append({"name": f"lnk-{a}-{b}", "a": a, "b": b, "capacity_gbps": _num(cap)})
    return switches, links


def _shard_groups(o: GenerateOptions, halls: list[list[_Row]]) -> list[list[_Row]]:
    """Rows of each shard: whole halls when shards <= halls, else each hall split by rows."""
    n = o.shards
    out: list[list[_Row]] = []
    if n <= len(halls):
        start = 0
        for size in _split(len(halls), n):
            out.append([row for rows in halls[start : start + size] for row in rows])
            start += size
        return out
    for rows, k in zip(halls, _split(n, len(halls)), strict=True):
        if k > len(rows):
            raise ValueError(
                f"--shards {n}: {rows[0].hall} has {len(rows)} rows, cannot split it into {k}"
            )
        total, acc, group = sum(r.gpus for r in rows), 0, []
        groups: list[list[_Row]] = []
        for i, row in enumerate(rows):
            group.append(row)
            acc += row.gpus
            left_rows, left_groups = len(rows) - i - 1, k - len(groups) - 1
            due = acc >= total * (len(groups) + 1) / k
            if left_groups > 0 and (due or left_rows == left_groups):
                groups.append(group)
                group = []
        groups.append(group)
        out += groups
    return out


def _shards(
    o: GenerateOptions,
    halls: list[list[_Row]],
    groups: list[list[_Row]],
    links: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """The shards section: rows per shard; spines, links between shards and CDUs that serve no
    rack (a short row's standby) each in one shard's ``owns``."""
    hall_rows = {rows[0].hall: {r.path for r in rows} for rows in halls}
    shard_of: dict[str, int] = {}  # node, leaf or spine -> shard index
    for i, group in enumerate(groups):
        for row in group:
            shard_of[_leaf(row)] = i
            shard_of.update((n, i) for rack in row.racks for n in rack.nodes)
    owns: list[list[str]] = [[] for _ in groups]
    for h, rows in enumerate(halls):  # a hall's spines: the shard of its first row
        owner = shard_of[_leaf(rows[0])]
        for s in _spines(o, h):
            shard_of[s] = owner
            owns[owner].append(s)
    for i, group in enumerate(groups):  # a row's standby CDUs that serve no rack yet
        for row in group:
            served = {r.cdu for r in row.racks}
            owns[i] += [c for c in row.cdus if c not in served]
    for lk in links:
        if shard_of[lk["a"]] != shard_of[lk["b"]]:  # between shards: the shard of its a end
            owns[shard_of[lk["a"]]].append(lk["name"])
    out: list[dict[str, Any]] = []
    for i, group in enumerate(groups):
        paths = {r.path for r in group}
        whole = [h for h, rs in hall_rows.items() if rs <= paths]
        shard: dict[str, Any] = {"name": f"shard-{i + 1}", "halls": whole}
        rows = [r.path for r in group if r.hall not in whole]
        if rows:
            shard["rows"] = rows
        shard["owns"] = owns[i]
        shard["api_url"] = f"http://127.0.0.1:{o.api_port + i}"
        out.append(shard)
    return out


def _halls(halls: list[list[_Row]]) -> list[dict[str, Any]]:
    return [
        {
            "name": rows[0].hall,
            "rows": [
                {
                    "name": row.name,
                    "racks": [
                        {
                            "name": rack.name,
                            "grid": [k, j],
                            "pdus": [f"pdu-{rack.name}-a", f"pdu-{rack.name}-b"],
                            "cdu": rack.cdu,
                            "nodes": [
                                {"name": n, "model": _model(rack.kind), "phase": PHASES[i % 3]}
                                for i, n in enumerate(rack.nodes)
                            ],
                        }
                        for k, rack in enumerate(row.racks)
                    ],
                }
                for j, row in enumerate(rows)
            ],
        }
        for rows in halls
    ]


# ---- YAML: block style down to the objects, each object one flow mapping -------------------------
def _scalar(v: Any) -> str:
    if isinstance(v, str):
        # names, slugs and models are plain scalars; anything else (a URL) double-quoted
        return v if _PLAIN.match(v) else json.dumps(v)
    return str(v)


def _flow(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_flow(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_flow(x) for x in v) + "]"
    return _scalar(v)


def _block(v: Any, indent: int, out: list[str], nest: tuple[str, ...]) -> None:
    """``v`` in block style for the keys in ``nest`` (halls, rows, racks), flow elsewhere;
    ``("*",)``: each key of an item on its own line."""
    pad = " " * indent
    if isinstance(v, list):
        for item in v:
            if isinstance(item, dict) and (nest == ("*",) or any(k in nest for k in item)):
                first = True
                for k, x in item.items():
                    lead = f"{pad}- " if first else f"{pad}  "
                    first = False
                    if k in nest and isinstance(x, list):
                        out.append(f"{lead}{k}:")
                        _block(x, indent + 4, out, nest)
                    else:
                        out.append(f"{lead}{k}: {_flow(x)}")
            else:
                out.append(f"{pad}- {_flow(item)}")


def to_yaml(data: dict[str, Any], header: list[str]) -> str:
    """A site mapping as YAML: one line per object below the hall tree."""
    out = [f"# {line}" if line else "#" for line in header]
    for key, value in data.items():
        if isinstance(value, list):
            out.append(f"{key}:")
            nest = {"halls": ("rows", "racks", "nodes"), "shards": ("*",)}.get(key, ())
            _block(value, 2, out, nest)
        else:
            out.append(f"{key}: {_flow(value)}")
    return "\n".join(out) + "\n"


def generate_site(o: GenerateOptions) -> GeneratedSite:
    """Build the site of ``o``; raises ValueError for options no site can meet."""
    notes: list[str] = []
    gpus = max(8, round(o.gpus / 8) * 8)  # every node holds 4 or 8 GPUs, a rack 72 or 8 x n
    if gpus != o.gpus:
        notes.append(f"--gpus {o.gpus} is no multiple of 8: generating {gpus} GPUs, the nearest")
    rng = np.random.default_rng(o.seed)
    halls = _layout(o, gpus, rng)
    empty = [f"hall-{_hall_letter(h)}" for h, rows in enumerate(halls) if not rows]
    if empty:
        raise ValueError(f"--gpus {gpus} over --halls {o.halls} leaves {empty[0]} without a rack")
    groups = _shard_groups(o, halls) if o.shards else [[r for rows in halls for r in rows]]
    fleets = _fleets(halls, rng, {row.path: i for i, group in enumerate(groups) for row in group})
    pdus, design = _power(halls)
    cdus = _cooling(halls, design)
    switches, links = _network(o, halls)
    data: dict[str, Any] = {
        "name": o.name,
        "halls": _halls(halls),
        "pdus": pdus,
        "cdus": cdus,
        "switches": switches,
        "links": links,
        "fleets": [{"name": n, "role": r, "members": m} for n, r, m in fleets],
    }
    if o.shards:
        data["shards"] = _shards(o, halls, groups, links)
    known = {
        k: v for k, v in data.items() if k in Site.model_fields
    }  # shards: once the model has it
    site = Site.model_validate(known)
    racks = [r for rows in halls for row in rows for r in row.racks]
    gpus_of = {r.name: len(r.nodes) * NODE_MODELS[_model(r.kind)].gpus for r in racks}
    summary = {
        "gpus_requested": o.gpus,
        "gpus": sum(gpus_of.values()),
        "halls": o.halls,
        "rows": sum(len(rows) for rows in halls),
        "racks_nvl72": sum(r.kind == "nvl72" for r in racks),
        "racks_hgx": sum(r.kind == "hgx" for r in racks),
        "nodes": len(site.nodes),
        "pdus": len(site.pdus),
        "cdus": len(site.cdus),
        "loops": len({c["loop"] for c in cdus}),
        "switches": len(site.switches),
        "links": len(site.links),
        "fleets": len(site.fleets),
        "inference_gpus": sum(gpus_of[r.name] for r in racks if r.role == "inference"),
        "design_it_kw": round(sum(design.values()) / 1e3, 1),
        "shards": o.shards,
    }
    header = [
        f"Generated by `dctwin site generate` (rules: twin/site/generate.py), seed {o.seed}:",
        f"{summary['gpus']} GPUs in {o.halls} halls, {summary['racks_nvl72']} GB200 NVL72 racks"
        f" and {summary['racks_hgx']} HGX racks, NVL72 share {o.nvl72_share},",
        f"inference share {o.inference_share}; {summary['design_it_kw']} kW IT at design load.",
        "",
    ]
    return GeneratedSite(to_yaml(data, header), site, summary, notes)
