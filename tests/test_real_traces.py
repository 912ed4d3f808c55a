"""Real A100 recordings as fixtures, the way a user meets them: each converted to the nvidia-smi
CSV log it came from, `dctwin import nvidia-smi`, `dctwin calibrate`, then `dctwin hotspots`
and the service's detection pass (:func:`twin.analysis.detect.detect`).

The recordings (``reference/real_traces``: one A100-SXM4-40GB in a rented air-cooled host, 1 Hz)
carry no licence: they are read in place from ``../shared`` and never copied here. What they
show, and what these tests hold the twin to:

- the blender runs are 440 s each: about 10 s idle, then a flat 160-190 W load; 2-4 min into it
  the die falls 10-15 K while the power stays flat (a host fan or airflow step). There is no
  inlet-air or coolant reading: calibration refuses R and C because the reference is missing,
  and, with an inlet assumed constant, because R is not identifiable (one power step, then a
  temperature step the power does not explain). The fall is flagged as a cooling change.
- the gpt2 run is 55 s of idle -> 250-295 W -> idle: too short for the 300 s an RC fit needs,
  and its fall follows the power, so it is no cooling change.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from collectors.contract import encode, topic_for
from twin.alerts import AlertEngine, Topology, parse_rules
from twin.alerts.metrics import COOLING_GPU_STEP_K
from twin.analysis.detect import detect, observations
from twin.cli import app
from twin.site.loader import load_site
from twin.store import Store

from .helpers import REPO

# real recordings imported and calibrated through the CLI, 1 s or more each: out of the fast tier
pytestmark = pytest.mark.slow

pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow", reason="reading the A100 parquet recordings needs pyarrow")

TRACES = REPO.parent / "shared" / "reference" / "real_traces"
BLENDER = [f"a100sxm4_blender_run{i}_1hz.parquet" for i in (1, 2, 3)]
GPT2 = "a100sxm4_gpt2_train_1hz.parquet"
needs_traces = pytest.mark.skipif(
    not all((TRACES / f).is_file() for f in [*BLENDER, GPT2]),
    reason=f"the A100 recordings are not in {TRACES} (they may not be copied into the repository)",
)

NODE = "a100-host"
GPU = f"{NODE}:0"
SITE_YAML = f"""\
# One air-cooled cloud host with one A100-SXM4-40GB; the PDU is a placeholder (no PDU readings).
name: a100
halls:
  - name: hall-1
    rows:
      - name: row-a
        racks:
          - name: r01
            grid: [0, 0]
            pdus: [pdu-1]
            nodes:
              - {{name: {NODE}, model: A100-SXM4-1}}
pdus:
  - {{name: pdu-1, feed: A, phases: 1, voltage_v: 230, rated_current_a: 16}}
"""
#: An alert rule on the cooling-change metric. Not shipped in deploy/alert_rules.yaml yet: there,
#: cdu_pump_lost would have to inhibit it for the ~10 min the GPUs are seen cooling back down
#: after the pumps return, and the engine holds every inhibit of a rule for the longest hold_s,
#: so the GPU temperature alerts would be muted that long too.
COOLING_RULE = """
rules:
  - name: gpu_cooling_changed
    type: drift
    metric: cooling.gpu.step_k
    entity_kind: gpu
    op: "<="
    value: -5
    resolve_if_absent_s: 120
    severity: info
    group_by: node
    summary: "GPU {entity_id}: {value:.1f} K below its model at flat power (cooling changed)"
"""
#: `nvidia-smi --query-gpu=<these> --format=csv` fields and the recording's columns
FIELDS = {
    "timestamp": None,
    "index": None,
    "uuid": "gpu_uuid",
    "name": "gpu_name",
    "utilization.gpu [%]": "gpu_utilization_pct",
    "utilization.memory [%]": "mem_utilization_pct",
    "memory.used [MiB]": "mem_used_mb",
    "power.draw [W]": "power_draw_w",
    "temperature.gpu": "temperature_c",
    "clocks.sm [MHz]": "sm_clock_mhz",
    "clocks.mem [MHz]": "mem_clock_mhz",
}
UNITS = {"%": " %", "MiB": " MiB", "W": " W", "MHz": " MHz"}


def invoke(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def recording(name: str):
    return pd.read_parquet(TRACES / name)


def to_nvidia_smi_csv(frame, path: Path) -> Path:
    """The recording as the `nvidia-smi --query-gpu=... --format=csv -l 1` log it was read
    from: header with units, values with units, ``YYYY/MM/DD HH:MM:SS.mmm`` timestamps (UTC)."""
    lines = [", ".join(FIELDS)]
    for row in frame.itertuples(index=False):
        t = datetime.fromtimestamp(row.timestamp_epoch, UTC)
        cells = [t.strftime("%Y/%m/%d %H:%M:%S.%f")[:-3], "0"]
        for field, col in list(FIELDS.items())[2:]:
            unit = re.search(r"\[(.+)\]", field)
            value = getattr(row, col)
            text = f"{value:.2f}" if col == "power_draw_w" else str(value)
            cells.append(text + (UNITS[unit.group(1)] if unit else ""))
        lines.append(", ".join(cells))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def site_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("site") / "a100.yaml"
    path.write_text(SITE_YAML)
    return path


def imported(tmp: Path, name: str, site_file: Path) -> Path:
    """A store holding recording ``name``, imported through `dctwin import nvidia-smi`."""
    csv = to_nvidia_smi_csv(recording(name), tmp / name.replace(".parquet", ".csv"))
    db = tmp / "a100.duckdb"
    res = invoke("import", "nvidia-smi", csv, "--node", NODE, "--db", db, "--site", site_file)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["rows_kept"] == len(recording(name)) and out["gpus"] == [GPU]
    assert out["ingest"]["dead_letters"] == {} and out["ingest"]["stored_messages"] == len(
        recording(name)
    )
    return db


def calibrate(db: Path, site_file: Path, window_s: float, holdout_s: float) -> dict:
    res = invoke(
        "calibrate", "--db", db, "--site", site_file, "--window", window_s, "--holdout", holdout_s,
        "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def gpu_param(result: dict, param: str) -> dict:
    (p,) = [p for p in result["params"] if p["id"] == GPU and p["param"] == param]
    return p


def steepest_fall(frame) -> tuple[datetime, float]:
    """When the recorded temperature falls fastest over 30 s, and by how much (K), read from
    the recording directly (not through the twin)."""
    temp = frame["temperature_c"].to_numpy(float)
    fall = temp[30:] - temp[:-30]
    i = int(np.argmin(fall))
    return datetime.fromtimestamp(frame["timestamp_epoch"].iloc[i], UTC), float(-fall[i])


@needs_traces
@pytest.mark.parametrize("name", BLENDER)
def test_blender_run_calibrates_and_refuses_rc_for_the_missing_reference(tmp_path, site_file, name):
    db = imported(tmp_path, name, site_file)
    result = calibrate(db, site_file, window_s=441, holdout_s=120)
    r, c = gpu_param(result, "r_k_per_w"), gpu_param(result, "c_j_per_k")
    assert r["usable"] is False and r["value"] is None and c["usable"] is False
    # the true reason: no inlet air or coolant temperature at all (the recording has none)
    # (the threshold in the unit it is stated in: time; the sample counts only beside it)
    assert (
        "reference: too few samples (0 s of readings < the 5 min a fit needs; 0 < 300 at 1 s)"
        in r["reason"]
    )
    # a refused fit publishes no error figure
    assert not [
        q for q in result["quality"] if q["id"] == GPU and q["quantity"].startswith("temp_c")
    ]
    assert "temperature:" not in r["reason"] and "power:" not in r["reason"]
    with Store(db, read_only=True) as store:
        for kind in ("node", "pdu", "cdu"):
            assert store.con.execute(f"SELECT count(*) FROM {kind}").fetchall() == [(0,)]
    # the power curve: the GPU sat at 0 % or ~100 % util, two levels. The SM-activity power
    # law cannot be fitted on that; a GPU-Util curve (issue 14 item 3) can where the idle
    # side has enough samples (run 3), and then it must read the recording's own levels
    util = recording(name)["gpu_utilization_pct"]
    assert ((util <= 5) | (util >= 95)).mean() > 0.97
    kind = gpu_param(result, "curve_kind")
    if kind["usable"] and kind["value"] == 0.0:
        # runs 1 and 2 (issue 29): every family is refused, and the straight line in GPU-Util
        # has an identifiable slope and a cross-validated error: published, marked as such
        assert kind["reason"].startswith("linear in GPU-Util (gamma fixed at 1"), kind
        assert "the curve was refused: power_law: " in kind["reason"]
        assert gpu_param(result, "gamma")["value"] == 1.0
        m = re.search(r"cross-validated MAE [\d.]+ W = ([\d.]+) % of the mean", kind["reason"])
        assert m and float(m.group(1)) < 8.0, kind["reason"]
        q = [r for r in result["quality"] if r["id"] == GPU and r["quantity"] == "power_w"]
        assert q and q[0]["n"] > 0  # a usable fit publishes its held-out error
        frame = recording(name)
        idle = frame.loc[util <= 5, "power_draw_w"].median()
        assert gpu_param(result, "idle_w")["value"] == pytest.approx(idle, rel=0.25)
    elif kind["usable"]:
        assert kind["value"] in (1.0, 2.0)  # two-level or saturating
        frame = recording(name)
        idle = frame.loc[util <= 5, "power_draw_w"].median()
        busy = frame.loc[util >= 95, "power_draw_w"].median()
        assert gpu_param(result, "idle_w")["value"] == pytest.approx(idle, rel=0.15)
        assert gpu_param(result, "limit_w")["value"] == pytest.approx(busy, rel=0.10)
    else:  # every family tried says why: the power law, and the util ones on too little idle
        assert kind["reason"].startswith("power_law: 2 distinct activity levels < 3; two_level: ")
        assert "levels not identifiable" in kind["reason"] and "saturating: " in kind["reason"]


def _ingest_assumed_inlet(tmp: Path, db: Path, site_file: Path, frame, inlet_c: float) -> None:
    """A constant inlet-air reading for the host at every second of the recording (an
    assumption: the recording has none), through `dctwin ingest --file`."""
    lines = []
    for seq, epoch in enumerate(frame["timestamp_epoch"]):
        payload = encode(
            collector="test-assumed-inlet",
            source=NODE,
            seq=seq,
            ts=float(epoch),
            samples=[{"id": NODE, "inlet_temp_c": inlet_c}],
        )
        lines.append(
            json.dumps({"topic": topic_for("a100", "node", NODE), "payload": payload.decode()})
        )
    path = tmp / "inlet.jsonl"
    path.write_text("\n".join(lines) + "\n")
    res = invoke("ingest", "--file", path, "--db", db, "--site", site_file, "--max-past", 0)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["stored_messages"] == len(frame)


@needs_traces
@pytest.mark.parametrize("name", BLENDER)
def test_with_an_assumed_inlet_rc_is_refused_as_not_identifiable(tmp_path, site_file, name):
    """Given the reference it lacks (a constant 25 °C inlet, absorbed by the fitted offset),
    the fit still refuses R and C: one idle -> load step, then a 10-15 K fall at flat power
    that no R and C explain. The reason's power spread is the recording's own."""
    frame = recording(name)
    db = imported(tmp_path, name, site_file)
    _ingest_assumed_inlet(tmp_path, db, site_file, frame, 25.0)
    result = calibrate(db, site_file, window_s=441, holdout_s=120)
    r = gpu_param(result, "r_k_per_w")
    assert r["usable"] is False and "reference:" not in r["reason"], r["reason"]
    # run 1 and 2: R and C not identifiable; run 3: C not identifiable and R's output-error
    # search not converged -- each with the standard error and the power spread it saw
    found = re.findall(
        r"([RC]) not identifiable \(standard error ([\d.]+) % > \d+ %; power std ([\d.]+) W",
        r["reason"],
    )
    assert found and "C" in {f[0] for f in found}, r["reason"]
    assert all(float(f[1]) > 10 for f in found)  # far over the 2 % / 5 % gates: no near miss
    # the fit window is the first 441 - 120 s of the grid that ends half a step after the
    # newest sample: the recording's first 320 or 321 rows
    stds = [frame["power_draw_w"].iloc[:n].std(ddof=0) for n in (320, 321)]
    for f in found:
        assert min(abs(float(f[2]) - s) for s in stds) < 0.6, (f, stds)


@needs_traces
@pytest.mark.parametrize("name", BLENDER)
def test_the_fall_at_flat_power_is_flagged_as_a_cooling_change(tmp_path, site_file, name):
    frame = recording(name)
    fall_at, fall_k = steepest_fall(frame)
    assert fall_k >= 10  # what the recording shows: 11-14 K within 30 s
    db = imported(tmp_path, name, site_file)
    calibrate(db, site_file, window_s=441, holdout_s=120)  # R refused: the catalog's R is used
    res = invoke("hotspots", "--db", db, "--site", site_file, "--json")
    assert res.exit_code == 0, res.output
    (h,) = [h for h in json.loads(res.stdout)["hotspots"] if h["reason"] == "cooling_changed"]
    assert h["id"] == GPU and h["excess"] <= -5
    at = datetime.fromisoformat(h["at"])
    assert abs((at - fall_at).total_seconds()) <= 30, (at, fall_at)
    assert 8 <= h["reference"] - h["value"] <= 20  # the 30 s mean before vs the minute after
    assert "cooling changed" in h["detail"] and "power stayed flat" in h["detail"]
    # the power over the fall really is flat within the detector's band (read directly)
    t = frame["timestamp_epoch"].to_numpy()
    epoch = fall_at.timestamp()
    around = frame["power_draw_w"][(t >= epoch - 90) & (t < epoch + 90)]
    assert around.rolling(30).mean().dropna().agg(lambda s: s.max() / s.min()) < 1.3

    # the service's detection pass turns it into an alert observation, now (newest sample) ...
    site = load_site(site_file)
    with Store(db, read_only=True) as store:
        obs = [o for o in observations(detect(store, site)) if o.metric == COOLING_GPU_STEP_K]
        assert [o.entity_id for o in obs] == [GPU] and obs[0].value == pytest.approx(h["excess"])
        # ... and not before the fall: the idle -> load rise is no cooling change
        before = detect(store, site, now=fall_at - timedelta(seconds=20))
        assert [o for o in observations(before) if o.metric == COOLING_GPU_STEP_K] == []
    # a rule on it pages once for the node (not in deploy/alert_rules.yaml: see COOLING_RULE)
    engine = AlertEngine(parse_rules(COOLING_RULE, "cooling.yaml"), Topology.from_site(site))
    pages = [n for n in engine.evaluate(obs, obs[0].ts) if n.rule == "gpu_cooling_changed"]
    assert [(p.status, p.severity) for p in pages] == [("firing", "info")]


@needs_traces
def test_gpt2_run_is_refused_as_too_short_and_its_fall_is_no_cooling_change(tmp_path, site_file):
    frame = recording(GPT2)
    span_s = frame["timestamp_epoch"].iloc[-1] - frame["timestamp_epoch"].iloc[0]
    assert len(frame) == 55 and 53 < span_s < 55
    db = imported(tmp_path, GPT2, site_file)
    result = calibrate(db, site_file, window_s=60, holdout_s=0)
    assert result["run"]["step_s"] == 1.0
    r = gpu_param(result, "r_k_per_w")
    # 55 samples of 1 s: the true span, against the 300 s (300 samples) an RC fit needs
    assert (
        r["usable"] is False
        and "temperature: too few samples (55 s of readings < the 5 min a fit needs;"
        " 55 < 300 at 1 s)"
        in r["reason"]
    )
    assert "power: too few samples (55 s of readings < the 5 min a fit needs" in r["reason"]
    why = gpu_param(result, "gamma")["reason"]  # every power-curve family says it, too short
    assert why.startswith("power_law: power: too few samples (")
    assert "two_level: power: too few samples" in why and "saturating: power: too few" in why
    res = invoke("hotspots", "--db", db, "--site", site_file, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["hotspots"] == []  # its fall follows the power: no event
    power = frame["power_draw_w"]
    assert power.max() > 250 and power.iloc[-1] < 100  # load -> idle, as the docstring says


@needs_traces
@pytest.mark.parametrize("name", BLENDER)
def test_the_fall_is_still_a_cooling_change_sampled_every_10_s(tmp_path, site_file, name):
    """Every tenth sample of the recording (an exporter scraped every 10 s): the detector works
    on the GPUs' own step, so the same fall is flagged, near the same time."""
    full = recording(name)
    fall_at, _ = steepest_fall(full)
    frame = full.iloc[::10].reset_index(drop=True)
    csv = to_nvidia_smi_csv(frame, tmp_path / name.replace(".parquet", "_10s.csv"))
    db = tmp_path / "a100-10s.duckdb"
    res = invoke("import", "nvidia-smi", csv, "--node", NODE, "--db", db, "--site", site_file)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["rows_kept"] == len(frame)
    res = invoke("hotspots", "--db", db, "--site", site_file, "--json")
    assert res.exit_code == 0, res.output
    (h,) = [h for h in json.loads(res.stdout)["hotspots"] if h["reason"] == "cooling_changed"]
    assert h["id"] == GPU and h["excess"] <= -5
    assert abs((datetime.fromisoformat(h["at"]) - fall_at).total_seconds()) <= 40
    assert "power stayed flat" in h["detail"]


@needs_traces
def test_refused_fits_publish_reasons_not_error_figures_and_plain_calibrate_prints_them(
    tmp_path, site_file
):
    """Blender run 1 with an assumed constant inlet: R and C are refused (not identifiable).
    The run publishes no temperature error figure for the GPU (it used to publish MAE 0.0 on
    n = 1) and the plain `dctwin calibrate` output names the refusal and its reason."""
    name = BLENDER[0]
    frame = recording(name)
    db = imported(tmp_path, name, site_file)
    _ingest_assumed_inlet(tmp_path, db, site_file, frame, 25.0)
    result = calibrate(db, site_file, window_s=441, holdout_s=120)
    r = gpu_param(result, "r_k_per_w")
    assert r["usable"] is False
    assert [q for q in result["quality"] if q["quantity"].startswith("temp_c")] == []
    for cls in result["classes"].values():
        assert not any(k.startswith("temp_c") for k in cls.get("quality", {})), cls
    res = invoke("calibrate", "--db", db, "--site", site_file, "--window", 441, "--holdout", 120)
    assert res.exit_code == 0, res.output
    assert "gpu refused fits: 1 device(s)" in res.stdout, res.stdout
    lines = [x for x in res.stdout.splitlines() if x.strip().startswith(f"{GPU}:")]
    assert any("R not identifiable" in x and "power std" in x for x in lines), res.stdout
