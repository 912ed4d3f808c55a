"""Alert-quality benchmark: simulated days of the demo site with random faults, paged by the
service's own detection passes over a store (``--path live``, the default, what ``dctwin serve``
pages) or by the what-if replay's detectors (``--path replay``), scored against the simulator's
ground truth.

Per simulated day (each its own seed-derived simulation, starting on consecutive dates):

1. **Faults.** ``--faults-per-kind`` faults of every kind the simulator injects
   (``twin.simulator.faults.FAULT_KINDS``) at random times and targets, drawn from ``--seed``
   and the day (:func:`draw_faults`). Targets whose related entities (below) overlap are
   redrawn, so each page can be tied to one fault.
2. **Simulate** the site in process (no broker), stepping every ``--tick-s`` (default 10 s, as
   the demo bundle was made; at 60 s steps the simulator's GPU thermal controller, which reads
   the temperature once a step, swings between hardware slowdown and full power on a GPU at its
   limit, since a cold plate's tau is 10-30 s), and hand the ingest every ``--resolution-s``
   worth of ticks (default 60 s: what a poller reading every minute sees; a 5-day run takes
   minutes on 2 vCPUs). Ingest through the normal ingest path into a temporary store,
   calibrate on the first two hours (before any fault starts) and record a bundle, as
   ``sample_telemetry/make_demo_bundle.py`` makes the demo bundle. The simulator's true
   (noise-free) state is kept at every tick.
3. **Page.** ``--path live`` (default): ``harness.live_path.drive`` runs the service's parts on
   the simulated clock (a store seeded from the demo bundle as ``dctwin demo`` starts, the
   ingester, the calibration scheduler, full detection every 60 s and the breached-now pass
   every 10 s, with ``--rules``, default ``deploy/alert_rules.yaml``); the pages are what the
   engine wrote to its history. ``--path replay``: the bundle through the alert evaluation
   ``dctwin whatif`` uses (``twin.replay.whatif.run`` on the baseline); its ``alerts`` are the
   notifications the rules would have sent. ``--path both`` runs each and lists the pages
   only one of them sent.
4. **Score** (:func:`score`) per fault kind.

Ground truth: a fault *crosses a limit* at the first tick in its active window (plus the margin)
where the simulator's true values pass a limit of ``twin.chain.limits`` / the catalog:

- ``cold_plate``, ``cold_plate_decay``: the GPU's true core temperature reaches its catalog
  ``max_operating_temp_c`` less 0.5 K, where the simulator's thermal controller starts to cap
  its power (``twin.simulator.engine``) and around which the true temperature then stays.
- ``pump_failure``: any GPU the CDU cools as above, or the CDU's heat over its capacity at the
  flow (``twin.chain.cdu_capacity_kw``), its flow below the flow its heat needs to hold the
  return limit (``twin.chain.flow_needed_lpm``), or its return over ``return_limit_c``.
- ``phase_overload``, ``phase_creep``: any line or breaker current of the PDU over its derated
  (80 %) limit (``twin.chain.limits.phase_table``).
- ``fleet_idle``: crosses no limit (paged by the drain detector, ``twin.analysis.fleet_drain``).

Attribution: a page (a ``firing`` notification of severity critical or warning; ``info`` is a
ticket, counted apart and never a page) is *tied* to a fault when it names an entity
related to the fault (its group, or an entity id in its summary or members) at a time in
``[start, end + margin]`` (``--margin-min``, default 30; a ramped fault lasts to the day's end):

- cold plate: the GPU, its node, its rack;
- pump failure: the CDU, its pump, its loop and every rack it cools with their nodes and GPUs;
- phase fault: the PDU, its phases and breakers, the racks it feeds;
- fleet idle: the fleet.

Per kind: the share of faults paged; of the faults that cross a limit, the share paged at or
before the crossing; the lead time of the first tied page to the crossing (or, for a fault that
crosses none, to its first physical effect, its start: the simulator applies every fault from its
start), median and min (negative: the page came after); pages per fault. Over the run: pages tied
to no fault (and per day per 1,000 GPUs), each classified by the simulator's truth, never by
the alert (``harness.fault_score.classify_untied``): a *true limit state without a fault*
when the true quantity the rule judges met the rule's condition over the minute before the page
(for a forecast rule: the true headroom reached the limit within its horizon), else *false*;
and incidents with more than two pages (a fault's tied
pages are one incident; untied pages are one incident per day, rule and group).

    PYTHONPATH=. .venv/bin/python bench/bench_alerts.py --days 5 --seed 0 --json /tmp/alerts.json
    PYTHONPATH=. .venv/bin/python bench/bench_alerts.py --days 1 --hours 4   # a quick look

Targets (issue 16): >= 95 % of the faults that cross a limit paged before the crossing (also
reported over the faults with a ramp: the step kinds cold_plate and phase_overload cross
within 0-3 min of their start, before a minute-sampled detector can see them); median
lead >= 10 min for cold_plate_decay and phase_creep (over their faults that cross a limit);
<= 1 page per day per 1,000 GPUs not tied to a fault; no incident with more than two pages.
Every figure is printed, met or missed; the exit status is 0 either way (1 on bad input).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.fault_score import STEP_KINDS, FaultCase, run_day, score  # noqa: E402
from twin.site import load_site  # noqa: E402

DEMO_BUNDLE = ROOT / "sample_telemetry" / "demo_bundle"

DEMO_SITE = ROOT / "sample_telemetry" / "demo_site.yaml"
DEMO_RULES = ROOT / "deploy" / "alert_rules.yaml"


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "-"
    if pct:
        return f"{100 * v:.0f} %"
    return f"{v:g}" if isinstance(v, float) else str(v)


def table(res: dict[str, Any]) -> str:
    s = res["score"]
    head = (
        "| kind | faults | paged | crossed | paged before crossing | lead median / min [min]"
        " | lead to crossing median / min [min] | pages | max pages/fault | faults > 2 pages |"
    )
    lines = [head, "|" + "---|" * 10]
    for kind, k in s["kinds"].items():
        lead, lx = k["lead_min"], k["lead_to_crossing_min"]
        paged = f"{k['paged']} ({_fmt(k['paged_share'], True)})"
        before = f"{k['paged_before_crossing']} ({_fmt(k['paged_before_crossing_share'], True)})"
        cells = [
            kind,
            k["faults"],
            paged,
            k["crossed"],
            before,
            f"{_fmt(lead['median'])} / {_fmt(lead['min'])}",
            f"{_fmt(lx['median'])} / {_fmt(lx['min'])}",
            k["pages"],
            k["max_pages_per_fault"],
            k["faults_over_2_pages"],
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += [
        "",
        f"faults {s['faults']}, crossing a limit {s['crossed']}, paged before the crossing"
        f" {s['paged_before_crossing']} ({_fmt(s['paged_before_crossing_share'], True)});"
        f" faults with a ramp (not {', '.join(STEP_KINDS)}): {s['ramped_paged_before_crossing']}"
        f" of {s['ramped_crossed']} ({_fmt(s['ramped_paged_before_crossing_share'], True)})",
        f"tickets (severity info, not paged): {res['tickets']}, by rule: {res['tickets_by_rule']}",
        f"pages tied to no fault: {s['untied_pages']} ({s['untied_pages_per_day_per_1000_gpus']}"
        f" per day per 1,000 GPUs); by rule: {s['untied_pages_by_rule']}",
        f"untied pages by the simulated truth: {s['untied_pages_by_class']['limit_state']} a"
        f" true limit state with no fault (the quantity within the rule's margin of its limit,"
        f" or a forecast that came true), {s['untied_pages_by_class']['false']} false"
        f" ({s['false_pages_per_day_per_1000_gpus']} per day per 1,000 GPUs); tied to a fault:"
        f" {s['tied_pages']}",
        f"incidents with > 2 pages: {s['incidents_over_2_pages']}"
        f" (untied rule+group keys: {s['untied_keys_over_2_pages'] or 'none'})",
        "",
        "targets:",
        *[f"  {'met   ' if ok else 'MISSED'} {name}" for name, ok in s["targets"].items()],
        "",
        f"step faults, crossing to first page [s]: {res['step_faults']['delays_s']}"
        f" (p95 {res['step_faults']['p95_s']}, target <= 60; not paged:"
        f" {res['step_faults']['not_paged']})",
        f"{res['path']} path: {res['days']} day(s) x {res['hours']} h, simulated every"
        f" {res['tick_s']:g} s, sampled"
        f" every {res['resolution_s']:g} s, {res['gpus']} GPUs,"
        f" seed {res['seed']}, rules {res['rules']}; {res['wall_s']:.0f} s",
    ]
    return "\n".join(lines)


def run_day_live(
    site_path: Path,
    rules_path: Path,
    day: int,
    seed: int,
    hours: float,
    resolution_s: float,
    tick_s: float,
    per_kind: int,
    margin_s: float,
    seed_bundle: Path | None,
) -> tuple[list[FaultCase], list[dict[str, Any]], dict[str, Any]]:
    """One day on the live path: the same faults and simulation as :func:`run_day` (same
    seeds), but every poll goes to the service's own ingester and the service's calibration
    scheduler and detection passes (full and breached-now) run on the simulated clock as
    `dctwin serve` runs them, from a calibration seeded from ``seed_bundle`` (the demo's
    start); the pages are what the service's alert engine wrote to ``alert_history``."""
    import tempfile

    import numpy as np

    from harness import fault_score as fs
    from harness.live_path import drive
    from twin.simulator.faults import Fault

    site = load_site(site_path)
    day_s = hours * 3600.0
    t0 = fs.START + timedelta(days=day)
    rng = np.random.default_rng([seed, day])
    cal_s = min(fs.CALIBRATION_S, day_s / 4)
    faults: list[Fault] = fs.draw_faults(site, rng, day_s, per_kind, cal_s)
    sim_seed = int(rng.integers(2**31))
    truth = fs.TruthRecorder(site)
    c0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        run = drive(
            site_path,
            Path(tmp) / "live.duckdb",
            start=t0,
            duration_s=day_s,
            rules=rules_path,
            seed=sim_seed,
            faults=faults,
            seed_calibration=seed_bundle,
            tick_s=tick_s,
            resolution_s=resolution_s,
            on_tick=lambda t_s, sim: truth.add(t_s, sim.true_state()),
        )
    alerts = [
        {
            "at": n["at"],
            "status": n["status"],
            "rule": n["rule"],
            "severity": n["severity"],
            "group": f"{n['group']['kind']} {n['group']['id']}",
            "members": n.get("members") or [],
            "summary": n["summary"],
            "repeat": n.get("repeat", 0),
            "flapping": n.get("flapping", False),
        }
        for n in run.notifications
    ]
    tr = truth.done()
    cases = []
    for f in faults:
        end_s = (
            day_s
            if (f.kind in fs.RAMPED_KINDS or f.duration_s is None)
            else f.start_s + f.duration_s
        )
        case = FaultCase(day, f.kind, f.target, f.start_s, min(end_s, day_s), str(f))
        case.related = fs.related_entities(site, f.kind, f.target)
        case.crossing_s, case.crossing = fs.crossing(site, tr, case, margin_s)
        cases.append(case)
    known = fs.known_ids(site)
    untied = fs.attribute(cases, alerts, t0, known, margin_s)
    from twin.alerts import load_rules

    fs.classify_untied(site, tr, load_rules(rules_path), untied, known)
    for u in untied:
        u["day"] = day
    info = {
        "day": day,
        "start": t0.isoformat(),
        "sim_seed": sim_seed,
        "notifications": len(alerts),
        "pages": sum(1 for a in alerts if fs.is_page(a)),
        "tickets": sum(1 for a in alerts if fs.is_ticket(a)),
        "tickets_by_rule": fs._by_rule([a for a in alerts if fs.is_ticket(a)]),
        "page_keys": sorted(
            {f"{a['rule']}|{a['group']}" for a in alerts if fs.is_page(a) and not a["repeat"]}
        ),
        "calibrations": run.calibrations,
        "passes": run.passes,
        "fast_passes": run.fast_passes,
        "timing_s": {**run.timing_s, "total_s": round(time.perf_counter() - c0, 1)},
    }
    return cases, untied, info


def step_page_delays(cases: list[FaultCase]) -> dict[str, Any]:
    """Step faults (cold_plate, phase_overload) that crossed a limit: seconds from the crossing
    to the first page, each, and their p95 (None: none crossed)."""
    import numpy as np

    delays = [
        min(c.pages) - c.crossing_s
        for c in cases
        if c.kind in STEP_KINDS and c.crossing_s is not None and c.pages
    ]
    missed = sum(
        1 for c in cases if c.kind in STEP_KINDS and c.crossing_s is not None and not c.pages
    )
    return {
        "delays_s": [round(d, 1) for d in delays],
        "p95_s": round(float(np.percentile(delays, 95)), 1) if delays else None,
        "not_paged": missed,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", type=int, default=5, help="simulated days (default 5)")
    ap.add_argument(
        "--hours", type=float, default=24.0, help="hours per simulated day (default 24)"
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of the faults and simulations")
    ap.add_argument(
        "--first-day",
        type=int,
        default=0,
        help="index of the first simulated day (default 0): days are independent (each its own"
        " seed-derived faults and simulation), so a long run can be split, day by day",
    )
    ap.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        metavar="JSON",
        help="score the days of earlier single-path --json results together (same settings,"
        " any seeds, no (seed, day) twice), each path apart, and compare the pages of the"
        " days both paths ran, instead of running anything",
    )
    ap.add_argument(
        "--split",
        type=Path,
        nargs="+",
        default=None,
        metavar="JSON",
        help="write each day of these single-path --json results as a result of its own"
        " ([replay-]seedS-dayD.json beside it; an existing file is not overwritten), so one"
        " day run again can replace that day alone in a --merge, instead of running anything",
    )
    ap.add_argument(
        "--resolution-s",
        type=float,
        default=60.0,
        help="sampling interval of the recorded telemetry [s] (default 60; the demo bundle: 10)",
    )
    ap.add_argument(
        "--tick-s",
        type=float,
        default=10.0,
        help="simulator step [s] (default 10; the GPU thermal controller needs <= ~10 s)",
    )
    ap.add_argument(
        "--faults-per-kind", type=int, default=2, help="faults of each kind per day (default 2)"
    )
    ap.add_argument(
        "--margin-min", type=float, default=30.0, help="attribution margin after a fault ends [min]"
    )
    ap.add_argument(
        "--site", type=Path, default=DEMO_SITE, help="site file (default: the demo site)"
    )
    ap.add_argument(
        "--rules", type=Path, default=DEMO_RULES, help="alert rule file (default: deploy's)"
    )
    ap.add_argument(
        "--json",
        type=Path,
        default=None,
        help="also write the results as JSON here ('-': stdout); with one --path, rewritten"
        " after each day with the days done so far",
    )
    ap.add_argument(
        "--keep", type=Path, default=None, help="keep each day's bundle under this directory"
    )
    ap.add_argument(
        "--path",
        choices=("live", "replay", "both"),
        default="live",
        help="live: the service's own ingest, calibration and detection passes over a store,"
        " seeded from the demo bundle, on the simulated clock (what `dctwin serve` pages);"
        " replay: the what-if replay's detectors over a recorded bundle; both: each, and the"
        " difference of their pages (default live)",
    )
    args = ap.parse_args(argv)
    if args.merge:
        return _merge_main(args)
    if args.split:
        return _split_main(args.split)
    problems = []
    if args.days < 1:
        problems.append(f"--days {args.days}: must be at least 1")
    if args.first_day < 0:
        problems.append(f"--first-day {args.first_day}: must be >= 0")
    if not (math.isfinite(args.hours) and 1.0 <= args.hours <= 168.0):
        problems.append(f"--hours {args.hours}: must be in 1..168")
    if not (math.isfinite(args.resolution_s) and 1.0 <= args.resolution_s <= 300.0):
        problems.append(f"--resolution-s {args.resolution_s}: must be in 1..300")
    elif not (math.isfinite(args.tick_s) and 0.1 <= args.tick_s <= args.resolution_s):
        problems.append(f"--tick-s {args.tick_s}: must be in 0.1..--resolution-s")
    elif abs(args.resolution_s / args.tick_s - round(args.resolution_s / args.tick_s)) > 1e-9:
        problems.append(f"--resolution-s {args.resolution_s}: not a multiple of --tick-s")
    if args.faults_per_kind < 1:
        problems.append(f"--faults-per-kind {args.faults_per_kind}: must be at least 1")
    if args.margin_min < 0:
        problems.append(f"--margin-min {args.margin_min}: must be >= 0")
    for flag, p in (("--site", args.site), ("--rules", args.rules)):
        if not p.is_file():
            problems.append(f"{flag} {p}: no such file")
    if problems:
        print("bench_alerts: " + "; ".join(problems), file=sys.stderr)
        return 1
    try:
        from twin.alerts import RuleFileError, load_rules

        load_rules(args.rules)
        site = load_site(args.site)
    except (RuleFileError, ValueError) as e:
        print(f"bench_alerts: {e}", file=sys.stderr)
        return 1
    paths = ("live", "replay") if args.path == "both" else (args.path,)
    results: dict[str, Any] = {}
    for p in paths:  # each path's table as soon as it is done (a day of the live path is long)
        results[p] = _run_path(p, args, site)
        print(table(results[p]), flush=True)
    if len(results) == 2:
        cmp = compare_paths(results["live"], results["replay"])
        results["comparison"] = cmp  # type: ignore[assignment]
        print(
            f"\nlive vs replay, pages (first notices, by rule and group): live {cmp['live']},"
            f" replay {cmp['replay']}, in both {cmp['both']}; only live: {cmp['only_live']};"
            f" only replay: {cmp['only_replay']}"
        )
    if args.json is not None:
        out = results if len(results) > 1 else results[paths[0]]
        if str(args.json) == "-":
            print(json.dumps(out, indent=1, default=str))
        else:
            _write_json(args.json, out)
    return 0


def compare_paths(live: dict[str, Any], replay: dict[str, Any]) -> dict[str, Any]:
    """The pages of the two paths as (seed, day, rule, group) keys, over the days both ran."""

    def day_keys(res: dict[str, Any]) -> dict[tuple[Any, int], set[str]]:
        seed = res.get("seed")
        return {(d.get("seed", seed), int(d["day"])): set(d["page_keys"]) for d in res["per_day"]}

    lv, rp = day_keys(live), day_keys(replay)
    days = sorted(set(lv) & set(rp), key=lambda sd: (str(sd[0]), sd[1]))
    keys = {
        name: {(sd, k) for sd in days for k in by_day[sd]}
        for name, by_day in (("live", lv), ("replay", rp))
    }

    def label(sd: tuple[Any, int], k: str) -> str:
        return f"seed {sd[0]} day {sd[1]}: {k}"

    return {
        "days": [f"seed {s} day {d}" for s, d in days],
        "live": len(keys["live"]),
        "replay": len(keys["replay"]),
        "both": len(keys["live"] & keys["replay"]),
        "only_live": sorted(label(*x) for x in keys["live"] - keys["replay"]),
        "only_replay": sorted(label(*x) for x in keys["replay"] - keys["live"]),
    }


def _run_path(path: str, args: argparse.Namespace, site: Any) -> dict[str, Any]:
    """Every simulated day through one path, scored. With ``--json FILE`` and one path, the
    file is rewritten after each day with the days done so far (a live day is long: a run
    stopped early keeps every finished day, scored)."""
    w0 = time.perf_counter()
    cases: list[FaultCase] = []
    untied: list[dict[str, Any]] = []
    days_info: list[dict[str, Any]] = []
    res: dict[str, Any] = {}
    for day in range(args.first_day, args.first_day + args.days):
        common = (
            args.site,
            args.rules,
            day,
            args.seed,
            args.hours,
            args.resolution_s,
            args.tick_s,
            args.faults_per_kind,
            args.margin_min * 60.0,
        )
        if path == "live":
            c, u, info = run_day_live(*common, DEMO_BUNDLE if args.site == DEMO_SITE else None)
        else:
            c, u, info = run_day(*common, args.keep)
        cases += c
        untied += u
        days_info.append(info)
        print(
            f"{path} day {day}: {info['pages']} pages, {info['timing_s']}",
            file=sys.stderr,
            flush=True,
        )
        res = _scored(path, args, site, cases, untied, days_info, w0)
        if args.json is not None and str(args.json) != "-" and args.path != "both":
            _write_json(args.json, res)
    return res


def _write_json(path: Path, res: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(res, indent=1, default=str))
    tmp.replace(path)


def _scored(
    path: str,
    args: argparse.Namespace,
    site: Any,
    cases: list[FaultCase],
    untied: list[dict[str, Any]],
    days_info: list[dict[str, Any]],
    w0: float,
) -> dict[str, Any]:
    """The days done so far (``days_info``) scored: the result ``--json`` writes."""
    days = len(days_info)
    gpus = sum(n.spec.gpus for n in site.nodes)
    return {
        "path": path,
        "days": days,
        "hours": args.hours,
        "seed": args.seed,
        "first_day": args.first_day,
        "resolution_s": args.resolution_s,
        "tick_s": args.tick_s,
        "faults_per_kind": args.faults_per_kind,
        "margin_min": args.margin_min,
        "site": str(args.site),
        "rules": str(args.rules),
        "commit": _commit(),
        "gpus": gpus,
        "score": score(cases, untied, days * args.hours / 24.0, gpus),
        "tickets": sum(i["tickets"] for i in days_info),
        "tickets_by_rule": {
            r: sum(i["tickets_by_rule"].get(r, 0) for i in days_info)
            for r in sorted({r for i in days_info for r in i["tickets_by_rule"]})
        },
        "faults": [
            {
                **{k: v for k, v in asdict(f).items() if k != "related"},
                "first_page_s": min(f.pages) if f.pages else None,
            }
            for f in cases
        ],
        "untied_pages": [
            {
                k: u.get(k)
                for k in (
                    "day",
                    "at",
                    "rule",
                    "severity",
                    "group",
                    "summary",
                    "truth_class",
                    "truth_value",
                )
            }
            for u in untied
        ],
        "per_day": days_info,
        "step_faults": step_page_delays(cases),
        "wall_s": round(time.perf_counter() - w0, 1),
    }


def _days_label(result: dict[str, Any]) -> str:
    """'seed 0 day 3' or 'seed 2 days 0, 1': the days one result ran."""
    days = [str(d["day"]) for d in result["per_day"]]
    word = "day" if len(days) == 1 else "days"
    return f"seed {result['seed']} {word} {', '.join(days)}"


def _commit() -> str:
    """The commit of the code this run imports (``git describe --always --dirty``), or
    "unknown" outside a git checkout: a merged table says which code each day ran."""
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


#: Settings that must agree for days of several runs to be scored together.
_MERGE_KEYS = ("path", "hours", "resolution_s", "tick_s", "faults_per_kind", "margin_min", "gpus")


def merge_results(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The days of several single-path results (``--json`` of earlier runs) scored as one run.
    Each day keeps its seed: an untied incident is keyed by seed and day. Raises ValueError
    when the settings differ or a (seed, day) appears twice."""
    if not results:
        raise ValueError("nothing to merge")
    base = results[0]
    for r in results:
        if "per_day" not in r or "faults" not in r:
            raise ValueError("not a single-path bench_alerts result (run with one --path)")
        diff = [k for k in _MERGE_KEYS if r.get(k) != base.get(k)]
        if diff:
            raise ValueError(f"settings differ ({', '.join(diff)}): cannot score together")
    seen: set[tuple[int, int]] = set()
    cases: list[FaultCase] = []
    untied: list[dict[str, Any]] = []
    per_day: list[dict[str, Any]] = []
    for r in results:
        seed = int(r["seed"])
        for d in r["per_day"]:
            key = (seed, int(d["day"]))
            if key in seen:
                raise ValueError(f"seed {seed} day {d['day']} is in two results")
            seen.add(key)
            per_day.append({**d, "seed": seed})
        cases += _fault_cases(r["faults"])
        for u in r["untied_pages"]:
            untied.append({**u, "day": f"seed {seed} day {u.get('day')}"})
    days = len(per_day)
    tickets_by_rule: dict[str, int] = {}
    for d in per_day:
        for rule, n in d["tickets_by_rule"].items():
            tickets_by_rule[rule] = tickets_by_rule.get(rule, 0) + n
    return {
        **{k: base.get(k) for k in (*_MERGE_KEYS, "site", "rules")},
        "days": days,
        "seed": ", ".join(str(s) for s in sorted({int(r["seed"]) for r in results})),
        "seed_days": sorted(f"seed {s} day {d}" for s, d in seen),
        "commits": {_days_label(r): r.get("commit", "not recorded") for r in results},
        "score": score(cases, untied, days * float(base["hours"]) / 24.0, int(base["gpus"])),
        "tickets": sum(d["tickets"] for d in per_day),
        "tickets_by_rule": dict(sorted(tickets_by_rule.items())),
        "faults": [{k: v for k, v in asdict(f).items() if k != "related"} for f in cases],
        "untied_pages": untied,
        "per_day": per_day,
        "step_faults": step_page_delays(cases),
        "wall_s": sum(float(r.get("wall_s", 0.0)) for r in results),
    }


def _fault_cases(faults: list[dict[str, Any]]) -> list[FaultCase]:
    """The fault cases of a result's ``faults`` (JSON), as they were scored."""
    names = set(FaultCase.__dataclass_fields__) - {"related"}
    return [FaultCase(**{k: v for k, v in f.items() if k in names}) for f in faults]


def split_result(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each day of a single-path result (``--json``) as a result of its own: its per-day
    record, its faults and its untied pages, scored again for one day."""
    if "per_day" not in result or "faults" not in result:
        raise ValueError("not a single-path bench_alerts result (run with one --path)")
    hours, gpus = float(result["hours"]), int(result["gpus"])
    out = []
    for d in result["per_day"]:
        day = int(d["day"])
        faults = [f for f in result["faults"] if int(f["day"]) == day]
        untied = [u for u in result["untied_pages"] if int(u["day"]) == day]
        cases = _fault_cases(faults)
        out.append(
            {
                **result,
                "days": 1,
                "first_day": day,
                "score": score(cases, untied, hours / 24.0, gpus),
                "tickets": d["tickets"],
                "tickets_by_rule": d["tickets_by_rule"],
                "faults": faults,
                "untied_pages": untied,
                "per_day": [d],
                "step_faults": step_page_delays(cases),
                "wall_s": float(d.get("timing_s", {}).get("total_s", 0.0)),
            }
        )
    return out


def _split_main(paths: list[Path]) -> int:
    """``--split``: each day of each result written beside it."""
    try:
        for p in paths:
            for r in split_result(json.loads(p.read_text())):
                prefix = "replay-" if r["path"] == "replay" else ""
                dest = p.parent / f"{prefix}seed{r['seed']}-day{r['first_day']}.json"
                if dest.exists():
                    raise ValueError(f"{dest} exists: not overwritten")
                _write_json(dest, {**r, "split_from": p.name})
                print(f"{p} day {r['first_day']} -> {dest}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"bench_alerts: --split: {e}", file=sys.stderr)
        return 1
    return 0


def _merge_main(args: argparse.Namespace) -> int:
    """Each path's results merged; where both paths ran the same (seed, day), their pages
    compared (a live run's days beside a replay run of the same days)."""
    try:
        loaded = [json.loads(p.read_text()) for p in args.merge]
        by_path: dict[str, list[dict[str, Any]]] = {}
        for r in loaded:
            by_path.setdefault(str(r.get("path")), []).append(r)
        merged = {p: merge_results(rs) for p, rs in sorted(by_path.items())}
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"bench_alerts: --merge: {e}", file=sys.stderr)
        return 1
    for res in merged.values():
        print(table(res))
        print(f"merged ({res['path']}): {', '.join(res['seed_days'])}")
        print("code: " + "; ".join(f"{k} at {c}" for k, c in res["commits"].items()))
    out: dict[str, Any] = next(iter(merged.values())) if len(merged) == 1 else dict(merged)
    if "live" in merged and "replay" in merged:
        cmp = compare_paths(merged["live"], merged["replay"])
        out["comparison"] = cmp
        print(
            f"\nlive vs replay over {len(cmp['days'])} days both ran, pages (first notices, by"
            f" rule and group): live {cmp['live']}, replay {cmp['replay']}, in both"
            f" {cmp['both']}; only live: {cmp['only_live']}; only replay: {cmp['only_replay']}"
        )
    if args.json is not None:
        if str(args.json) == "-":
            print(json.dumps(out, indent=1, default=str))
        else:
            _write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
