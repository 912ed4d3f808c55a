"""A first calibration seeded from a recorded bundle, until the first fit on live data.

A fresh store has no calibration: hot spots have no model to compare against and headroom
uses catalog parameters until the scheduler's first fit (10 minutes of GPU telemetry,
:data:`twin.calibrate.schedule.FIRST_WINDOW_S`). A bundle recorded on the same site
(``dctwin record``) carries the calibration its store had (``calibration.json.gz``), so
`dctwin serve --seed-calibration BUNDLE` (the demo passes the shipped demo bundle) stores
that run first, marked ``source = 'seed'`` with the bundle and the time it was seeded. The
first fit on live data is a newer run and replaces it everywhere the newest run is read.

Only a store without any calibration run is seeded, and only from a bundle of the same site
(same name and the same GPU ids): parameters of another site's devices would be wrong
silently. A seeded run is a run like any other for its readers: headroom and hot spots use
its parameters, and its thermal resistances join each GPU's own history (the drift rule's
reference), as the recorded day's calibration they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from twin.site import Site
from twin.store import Store

__all__ = ["SeedError", "SeededRun", "check_bundle_site", "seed_from_bundle"]

#: The scheduler's default window and holdout (twin.service.ServiceConfig): a bundle written
#: before bundles kept the holdout start gets it in the same ratio, as the scheduler
#: shrinks a short window's holdout (twin/calibrate/schedule.py). [s]
DEFAULT_WINDOW_S = 7200.0
DEFAULT_HOLDOUT_S = 1200.0


class SeedError(ValueError):
    """The bundle cannot seed this store; the message names the bundle and why."""


@dataclass(frozen=True)
class SeededRun:
    """What :func:`seed_from_bundle` stored."""

    run_id: int
    bundle: Path
    seeded_at: datetime
    fitted_at: datetime
    params: int


def _site_gpus(site: Site) -> set[str]:
    return {g for n in site.nodes for g in n.gpu_ids()}


def check_bundle_site(bundle_site: Site, site: Site, bundle: Path) -> None:
    """Raise :class:`SeedError` unless the bundle was recorded on ``site`` (name, GPU ids)."""
    if bundle_site.name != site.name:
        raise SeedError(
            f"{bundle}: recorded on site {bundle_site.name!r}, not {site.name!r}: its"
            " calibration does not fit this site"
        )
    theirs, ours = _site_gpus(bundle_site), _site_gpus(site)
    if theirs != ours:
        raise SeedError(
            f"{bundle}: its site has {len(theirs)} GPUs, {len(theirs & ours)} of them in this"
            f" site's {len(ours)}: its calibration does not fit this site"
        )


def _ts(value: Any) -> datetime:
    t = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def seed_from_bundle(
    store: Store, site: Site, bundle_path: Path, *, now: datetime | None = None
) -> SeededRun | None:
    """Store the calibration of the bundle at ``bundle_path`` as the store's first run,
    marked seeded; None (nothing stored) when the store already has a calibration run.

    Raises :class:`SeedError` for a path that is no bundle, a bundle without a calibration
    or one recorded on another site."""
    from twin.replay.bundle import Bundle, BundleError

    if store.latest_calibration_run_id() is not None:
        return None
    try:
        bundle = Bundle.load(bundle_path)
    except BundleError as e:
        raise SeedError(str(e)) from None
    except (OSError, ValueError) as e:
        raise SeedError(f"{bundle_path}: {e}") from None
    cal = bundle.calibration
    if not cal or not cal.get("params"):
        raise SeedError(f"{bundle_path}: the bundle holds no calibration (calibration.json.gz)")
    check_bundle_site(bundle.site, site, bundle_path)
    seeded_at = now or datetime.now(UTC)
    try:
        start, end = _ts(cal["window_start"]), _ts(cal["window_end"])
        holdout = cal.get("holdout_start")
        if holdout is None:
            holdout_start = end - (end - start) * (DEFAULT_HOLDOUT_S / DEFAULT_WINDOW_S)
        else:
            holdout_start = _ts(holdout)
        fitted_at = _ts(cal["fitted_at"])
        gpus = cal.get("gpus")
        if gpus is None:
            gpus = len({p["id"] for p in cal["params"] if p["kind"] == "gpu"})
        run = {
            "fitted_at": fitted_at,
            "window_start": start,
            "window_end": end,
            "holdout_start": holdout_start,
            "gpus": int(gpus),
            "seconds": float(cal.get("seconds") or 0.0),
            "source": "seed",
            "seeded_from": str(bundle_path),
            "seeded_at": seeded_at,
        }
        run_id = store.save_calibration_run(run, cal["params"], cal.get("quality") or [], [])
    except (KeyError, TypeError, ValueError) as e:
        raise SeedError(f"{bundle_path}/calibration.json.gz: unreadable run ({e})") from None
    return SeededRun(run_id, Path(bundle_path), seeded_at, fitted_at, len(cal["params"]))


def seed_note(run: dict[str, Any], expected_fit_at: datetime | None) -> str:
    """The line the API and the console show for a seeded newest run."""
    src = Path(str(run.get("seeded_from") or "a bundle"))
    what = f"the demo bundle ({src})" if src.name == "demo_bundle" else f"bundle {src}"
    text = f"seeded from {what} at {hhmm(run.get('seeded_at'))}"
    if expected_fit_at is None:
        return text + "; no fit on live data is scheduled by this service"
    return text + f"; first fit on live data expected at {hhmm(expected_fit_at)}"


def hhmm(t: Any) -> str:
    """``HH:MM UTC`` of a time (with the date when it is not today's, UTC)."""
    if t is None:
        return "an unknown time"
    t = _ts(t).astimezone(UTC)
    now = datetime.now(UTC)
    if abs(t - now) < timedelta(hours=20) and t.date() == now.date():
        return t.strftime("%H:%M UTC")
    return t.strftime("%Y-%m-%d %H:%M UTC")
