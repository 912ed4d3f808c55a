"""`dctwin site generate`: generated sites load with the normal loader and are sized right."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from twin.chain.limits import derated_a, feed_capacity_kw
from twin.chain.propagate import node_input_w
from twin.cli import app
from twin.site import GPU_MODELS, Site, load_site
from twin.site.catalog import ASSUMPTIONS

runner = CliRunner()


def _yaml(path: Path) -> dict:
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def generate(tmp_path: Path, *args: str, name: str = "site.yaml") -> tuple[Path, dict]:
    out = tmp_path / name
    res = runner.invoke(app, ["site", "generate", *args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stderr.strip().splitlines()[-1])
    return out, summary


def design_w(node) -> float:
    """Input power of a node with every GPU at its TDP (the chain's node model)."""
    return float(node_input_w(GPU_MODELS[node.spec.gpu].tdp_w, node.spec))


SIZES = [
    ("--gpus", "200", "--halls", "1"),
    ("--gpus", "2000", "--halls", "2", "--nvl72-share", "0.8", "--inference-share", "0.5"),
    ("--gpus", "1920", "--halls", "3", "--nvl72-share", "0", "--racks-per-row", "8"),
    ("--gpus", "1440", "--halls", "2", "--nvl72-share", "1"),
]


@pytest.mark.parametrize("args", SIZES, ids=lambda a: "-".join(a[1::2]))
def test_generated_sites_load_and_counts_match(tmp_path: Path, args: tuple[str, ...]) -> None:
    path, summary = generate(tmp_path, *args)
    site = load_site(path)  # the normal loader: YAML, line numbers, the site model
    opts = dict(zip(args[::2], args[1::2], strict=True))
    gpus = sum(n.spec.gpus for n in site.nodes)
    assert gpus == int(opts["--gpus"]) == summary["gpus"]
    assert len(site.halls) == int(opts["--halls"]) == summary["halls"]
    assert [h.name for h in site.halls] == [f"hall-{c}" for c in "abc"[: len(site.halls)]]
    models = Counter(n.model for n in site.nodes)
    nvl72 = models["GB200-NVL72-TRAY"] * 4
    share = float(opts.get("--nvl72-share", 0.5))
    assert abs(nvl72 - share * gpus) <= 72  # whole NVL72 racks
    assert summary["racks_nvl72"] * 18 == models["GB200-NVL72-TRAY"]
    assert summary["nodes"] == len(site.nodes) and summary["links"] == len(site.links)
    assert summary["pdus"] == len(site.pdus) == 2 * len(site.racks)
    # every node in exactly one fleet; the inference share of racks, within one rack per hall
    # and kind
    members = Counter(n for f in site.fleets for n in _fleet_nodes(site, f))
    assert set(members) == {n.name for n in site.nodes} and set(members.values()) == {1}
    inf = sum(
        n.spec.gpus for f in site.fleets if f.role == "inference" for n in _fleet_nodes_obj(site, f)
    )
    assert inf == summary["inference_gpus"]
    assert abs(inf - float(opts.get("--inference-share", 0.3)) * gpus) <= 2 * 72 * len(site.halls)
    # round trip: the file holds what the generator validated, and dumps back to the same model
    again = Site.model_validate(_yaml(path))
    assert again.model_dump() == site.model_dump()


def _fleet_nodes_obj(site: Site, fleet):
    racks = {r.name: r for r in site.racks}
    for m in fleet.members:
        yield from racks[m].nodes if m in racks else [n for n in site.nodes if n.name == m]


def _fleet_nodes(site: Site, fleet):
    return (n.name for n in _fleet_nodes_obj(site, fleet))


def test_every_rack_has_pdus_and_a_cdu_sized_to_its_design_load(tmp_path: Path) -> None:
    path, _ = generate(tmp_path, "--gpus", "2000", "--halls", "2", "--racks-per-row", "6")
    site = load_site(path)
    pf = ASSUMPTIONS.power_factor
    loops: dict[str, list] = {}
    heat_of_cdu: Counter[str] = Counter()
    for rack in site.racks:
        load_w = sum(design_w(n) for n in rack.nodes)
        feeds = [site.pdu_by_name[p] for p in rack.pdus]  # KeyError: a PDU that does not exist
        assert sorted(p.feed for p in feeds) == ["A", "B"]
        for pdu in feeds:  # 2N: either feed alone carries the whole rack, phase by phase
            assert feed_capacity_kw(pdu, pf) * 1e3 >= load_w
            v_ln = pdu.voltage_v / math.sqrt(3.0)
            for br in pdu.breakers:
                on_phase = sum(design_w(n) for n in rack.nodes if n.phase == br.phase)
                assert on_phase / (v_ln * pf) <= float(derated_a(br.rated_current_a)), (rack, br)
            assert {b.phase for b in pdu.breakers} == {"L1", "L2", "L3"}
        cdu = site.cdu_by_name[rack.cdu]  # KeyError: a CDU that does not exist
        heat_kw = load_w / 1e3 * site.capture_fraction(rack)
        assert cdu.capacity_kw >= heat_kw
        heat_of_cdu[cdu.name] += heat_kw
        loops.setdefault(cdu.loop, [])
    for cdu in site.cdus:
        assert cdu.model == "ROW-CDU-1500" and cdu.capacity_kw == 1500.0  # from the catalog
        assert heat_of_cdu[cdu.name] <= cdu.capacity_kw
        loops[cdu.loop].append(cdu)
    for cdus in loops.values():  # N+1: the loop carries its racks with its largest CDU lost
        heat = sum(heat_of_cdu[c.name] for c in cdus)
        assert sum(c.capacity_kw for c in cdus) - max(c.capacity_kw for c in cdus) >= heat


def test_network_leaf_per_row_spines_per_hall(tmp_path: Path) -> None:
    path, _ = generate(tmp_path, "--gpus", "2400", "--halls", "3", "--spines-per-hall", "2")
    site = load_site(path)
    roles = Counter(s.role for s in site.switches)
    assert roles["spine"] == 2 * 3
    assert roles["leaf"] == sum(len(h.rows) for h in site.halls)
    by_end: dict[str, list] = {}
    for lk in site.links:
        by_end.setdefault(lk.a, []).append(lk)
    for hall in site.halls:
        spines = {f"spine-{hall.name[-1]}{k}" for k in (1, 2)}
        for row in hall.rows:
            leaf = f"leaf-{hall.name[-1]}-{row.name[-2:]}"
            down = [lk for r in row.racks for n in r.nodes for lk in by_end[n.name]]
            assert {lk.b for lk in down} == {leaf}
            assert len(down) == sum(len(r.nodes) for r in row.racks)
            up = by_end[leaf]
            assert {lk.b for lk in up} == spines  # a leaf reaches every spine of its hall
            # non-blocking: the uplinks carry what the nodes can send
            assert sum(lk.capacity_gbps for lk in up) == pytest.approx(
                sum(lk.capacity_gbps for lk in down)
            )
    between = [lk for lk in site.links if lk.a.startswith("spine-")]
    assert len(between) == 3 * 2  # a ring of three halls, one link per spine plane


def test_same_seed_same_file_other_seed_other_file(tmp_path: Path) -> None:
    args = ("--gpus", "1200", "--halls", "2", "--racks-per-row", "3")
    a, _ = generate(tmp_path, *args, "--seed", "7", name="a.yaml")
    b, _ = generate(tmp_path, *args, "--seed", "7", name="b.yaml")
    c, _ = generate(tmp_path, *args, "--seed", "8", name="c.yaml")
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    sa, sc = load_site(a), load_site(c)
    assert sum(n.spec.gpus for n in sa.nodes) == sum(n.spec.gpus for n in sc.nodes)


def test_gpu_count_not_a_multiple_of_8_says_the_nearest(tmp_path: Path) -> None:
    out = tmp_path / "s.yaml"
    res = runner.invoke(app, ["site", "generate", "--gpus", "1003", "--out", str(out)])
    assert res.exit_code == 0
    assert "generating 1000 GPUs, the nearest" in res.stderr
    assert sum(n.spec.gpus for n in load_site(out).nodes) == 1000


def test_stdout_by_default(tmp_path: Path) -> None:
    res = runner.invoke(app, ["site", "generate", "--gpus", "64"])
    assert res.exit_code == 0
    path = tmp_path / "s.yaml"
    path.write_text(res.stdout)
    assert sum(n.spec.gpus for n in load_site(path).nodes) == 64


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "0"], "--gpus: Input should be greater than 0"),
        (["--gpus", "800", "--nvl72-share", "1.5"], "--nvl72-share: Input should be less than"),
        (["--gpus", "16", "--halls", "5"], "--gpus 16 over --halls 5 leaves hall-c"),
        (["--gpus", "1000", "--shards", "9"], "--shards 9: hall-a has 2 rows"),
        (["--gpus", "64", "--name", "bad name"], "--name: String should match pattern"),
    ],
)
def test_bad_options_one_clear_line(args: list[str], message: str) -> None:
    res = runner.invoke(app, ["site", "generate", *args])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert "Traceback" not in res.output


@pytest.mark.parametrize(
    ("halls", "shards"), [(4, 4), (2, 3), (4, 2)], ids=["4x4", "2h-3s", "4h-2s"]
)
def test_shards_section_follows_the_spec(tmp_path: Path, halls: int, shards: int) -> None:
    args = ("--gpus", "1600", "--halls", str(halls), "--racks-per-row", "2")
    path, summary = generate(tmp_path, *args, "--shards", str(shards))
    plain, _ = generate(tmp_path, *args, name="plain.yaml")
    data = _yaml(path)
    site = Site.model_validate({k: v for k, v in data.items() if k != "shards"})
    if shards <= halls:  # whole halls: the section adds, changes nothing
        assert site.model_dump() == load_site(plain).model_dump()
    section = data["shards"]
    assert summary["shards"] == shards and len(section) == shards
    assert len({s["name"] for s in section}) == shards
    for s in section:
        assert set(s) <= {"name", "halls", "rows", "owns", "api_url"}
        assert s["api_url"].startswith("http://127.0.0.1:")
    # every row in exactly one shard, through its hall or by name
    owner: Counter[str] = Counter()
    shard_of_row: dict[str, str] = {}
    for s in section:
        for h in s["halls"]:
            hall = next(x for x in site.halls if x.name == h)
            for row in hall.rows:
                owner[f"{h}/{row.name}"] += 1
                shard_of_row[f"{h}/{row.name}"] = s["name"]
        for path_ in s.get("rows", []):
            owner[path_] += 1
            shard_of_row[path_] = s["name"]
    all_rows = {f"{h.name}/{r.name}" for h in site.halls for r in h.rows}
    assert set(owner) == all_rows and set(owner.values()) == {1}
    # every spine, and every link between two shards, owned by exactly one shard
    owns = Counter(c for s in section for c in s["owns"])
    assert set(owns.values()) == {1}
    spines = {s.name for s in site.switches if s.role == "spine"}
    assert spines <= set(owns)
    standby = {c.name for c in site.cdus} - {r.cdu for r in site.racks}  # serve no rack
    assert standby <= set(owns)
    shard_of: dict[str, str] = {}
    for h in site.halls:
        for row in h.rows:
            sh = shard_of_row[f"{h.name}/{row.name}"]
            shard_of[f"leaf-{h.name[-1]}-{row.name[-2:]}"] = sh
            shard_of.update((n.name, sh) for r in row.racks for n in r.nodes)
    for s in section:
        shard_of.update((c, s["name"]) for c in s["owns"] if c in spines)
    for lk in site.links:
        spans = shard_of[lk.a] != shard_of[lk.b]
        assert (lk.name in owns) == spans, lk
    assert set(owns) == spines | standby | {lk.name for lk in site.links if lk.name in owns}
    racks = {r.name: r for r in site.racks}
    for f in site.fleets:  # no fleet spans two shards
        assert len({shard_of[n.name] for m in f.members for n in racks[m].nodes}) == 1, f
    if halls == shards:  # one hall a shard, whole
        assert [s["halls"] for s in section] == [[h.name] for h in site.halls]
        assert all("rows" not in s for s in section)


@pytest.mark.parametrize(
    ("halls", "shards"), [(4, 4), (2, 3), (4, 2)], ids=["4x4", "2h-3s", "4h-2s"]
)
def test_generated_shards_partition_every_source(tmp_path: Path, halls: int, shards: int) -> None:
    if "shards" not in Site.model_fields:
        pytest.skip("twin.site.model.Site has no `shards` field yet (issue 17 item 1)")
    from twin.site.shards import shard_view

    args = ("--gpus", "1600", "--halls", str(halls), "--racks-per-row", "2")
    path, _ = generate(tmp_path, *args, "--shards", str(shards))
    site = load_site(path)  # the site model's own shard checks
    assert len(site.shards) == shards
    views = [shard_view(site, s.name) for s in site.shards]
    sources = Counter(src for v in views for src in v.sources)
    assert set(sources.values()) == {1}  # every source in exactly one shard
    assert {src for src in sources if src[0] == "gpu"} == {("gpu", n.name) for n in site.nodes}
    assert {src[1] for src in sources if src[0] == "pdu"} == {p.name for p in site.pdus}
    assert {src[1] for src in sources if src[0] == "cdu"} == {c.name for c in site.cdus}


def test_the_simulator_runs_a_generated_site(tmp_path: Path) -> None:
    path, _ = generate(tmp_path, "--gpus", "1000", "--halls", "2")
    site = load_site(path)
    jsonl = tmp_path / "sim.jsonl"
    args = ["sim", "--site", str(path), "--no-mqtt", "--jsonl", str(jsonl)]
    res = runner.invoke(app, [*args, "--duration", "2", "--speed", "0"])
    assert res.exit_code == 0, res.output
    topics = Counter(json.loads(line)["topic"].split("/")[3] for line in jsonl.open())
    assert topics["gpu"] == topics["node"] == 2 * len(site.nodes)
    assert topics["pdu"] == 2 * len(site.pdus) and topics["cdu"] == 2 * len(site.cdus)
    # link telemetry comes from each leaf and from the spines at the a end of a hall-to-hall link
    owners = {lk.b if lk.b.startswith("leaf-") else lk.a for lk in site.links}
    assert topics["link"] == 2 * len(owners) == 2 * (4 + 4)


def test_help_lists_the_command_and_its_options() -> None:
    top = runner.invoke(app, ["--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert top.exit_code == 0 and "site" in top.output
    res = runner.invoke(
        app, ["site", "generate", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"}
    )
    assert res.exit_code == 0
    for option in ("--gpus", "--halls", "--nvl72-share", "--inference-share", "--seed", "--shards"):
        assert option in res.output
