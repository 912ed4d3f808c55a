"""The site view's merge rules for the answers the console added after the site view was
written: the calibration's note and expected first fit, and the Overview's headroom history."""

from __future__ import annotations

from twin.siteview import merge


def test_calibration_carries_every_shards_note_and_the_earliest_expected_fit() -> None:
    a = {
        "run": None,
        "runs": 0,
        "fits": 0,
        "first_fit_expected_at": "2026-12-02T18:40:00+00:00",
        "note": "no calibration yet: first fit expected at 18:40 UTC",
        "classes": [],
        "events": [],
    }
    b = {
        "run": {"run_id": 3, "fitted_at": "2026-12-02T18:10:00+00:00", "source": "fit"},
        "runs": 3,
        "fits": 3,
        "first_fit_expected_at": None,
        "note": "fitted on live data at 18:10 UTC",
        "classes": [{"cls": "x"}],
        "events": [],
    }
    out = merge.calibration([a, b])
    assert out["run"]["run_id"] == 3 and out["runs"] == 3 and out["fits"] == 3
    assert out["first_fit_expected_at"] == "2026-12-02T18:40:00+00:00"
    assert out["note"] == a["note"] + "; " + b["note"]
    assert merge.calibration([{"runs": 0}])["note"] == "no shard has a calibration yet"


def test_headroom_history_is_the_tightest_of_the_shards_per_minute() -> None:
    a = {
        "start": "2026-12-01T19:00:00+00:00",
        "kinds": [
            {
                "kind": "pdu_phase",
                "t": ["2026-12-02T19:00:05+00:00", "2026-12-02T19:01:05+00:00"],
                "used_pct": [60.0, None],
            }
        ],
    }
    b = {
        "start": "2026-12-01T19:00:01+00:00",
        "kinds": [
            {"kind": "pdu_phase", "t": ["2026-12-02T19:00:40+00:00"], "used_pct": [72.5]},
            {"kind": "gpu_temp", "t": ["2026-12-02T19:01:40+00:00"], "used_pct": [80.0]},
        ],
    }
    out = merge.headroom_history([a, b])
    assert out["start"] == "2026-12-01T19:00:00+00:00"
    by_kind = {k["kind"]: k for k in out["kinds"]}
    assert by_kind["pdu_phase"]["t"] == ["2026-12-02T19:00:00Z", "2026-12-02T19:01:00Z"]
    assert by_kind["pdu_phase"]["used_pct"] == [72.5, None]
    assert by_kind["gpu_temp"]["used_pct"] == [80.0]
