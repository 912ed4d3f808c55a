"""The store's calibration tables: the one place that reads and writes them.

A calibration run (:mod:`twin.calibrate`) is one row of ``calibration_runs`` plus its
parameters, fit quality and drift events, all under one ``run_id`` (a version: runs are only
ever added). :class:`CalibrationTables` is mixed into :class:`twin.store.Store`; hot spots,
headroom, the API, the bundles and calibrate itself call these methods instead of writing
their own SQL against the tables.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import duckdb
import pyarrow as pa

__all__ = [
    "PARAM_COLUMNS",
    "QUALITY_COLUMNS",
    "RUN_COLUMNS",
    "RUN_SOURCES",
    "CalibrationTables",
    "ParamKey",
]

RUN_COLUMNS = (
    "run_id",
    "fitted_at",
    "window_start",
    "window_end",
    "holdout_start",
    "gpus",
    "seconds",
    "source",
    "seeded_from",
    "seeded_at",
)
#: ``calibration_runs.source``: a fit on this store's telemetry, or parameters seeded from a
#: recorded bundle's calibration (:mod:`twin.calibrate.seed`) until the first fit.
RUN_SOURCES = ("fit", "seed")
PARAM_COLUMNS = ("kind", "id", "param", "value", "stderr", "usable", "reason")
QUALITY_COLUMNS = ("kind", "id", "quantity", "mae", "cv_rmse", "nmbe", "mape", "n")
EVENT_COLUMNS = ("kind", "id", "param", "value", "own_median", "fleet_median", "detail")

#: (device kind, device id, parameter name)
ParamKey = tuple[str, str, str]


def _filters(kind: str | None, params: Iterable[str] | None) -> tuple[str, list[Any]]:
    sql, args = "", []
    if kind is not None:
        sql += " AND kind = ?"
        args.append(kind)
    if params is not None:
        sql += " AND list_contains(?, param)"
        args.append(list(params))
    return sql, args


class CalibrationTables:
    """Reads and writes of ``calibration_runs``, ``_params``, ``_quality`` and ``_events``."""

    con: duckdb.DuckDBPyConnection

    # ---- reads ---------------------------------------------------------------------------

    def calibration_runs(self) -> list[dict[str, Any]]:
        """Every run, newest first: ``run_id``, ``fitted_at``, the window, GPUs, seconds."""
        rows = self.con.execute(
            f"SELECT {', '.join(RUN_COLUMNS)} FROM calibration_runs ORDER BY run_id DESC"
        ).fetchall()
        return [dict(zip(RUN_COLUMNS, r, strict=True)) for r in rows]

    def latest_calibration_run_id(self) -> int | None:
        """The newest run's id; None before the first calibration."""
        run_id = self.con.execute("SELECT max(run_id) FROM calibration_runs").fetchall()[0][0]
        return None if run_id is None else int(run_id)

    def latest_fit_run_id(self) -> int | None:
        """The newest run fitted on this store's telemetry (``source = 'fit'``); None while the
        store has none (no run yet, or only a seeded one). Model-based alert rules (residual,
        R drift, the GPU temperature forecast) judge only such a run's parameters."""
        run_id = self.con.execute(
            "SELECT max(run_id) FROM calibration_runs WHERE coalesce(source, 'fit') = 'fit'"
        ).fetchall()[0][0]
        return None if run_id is None else int(run_id)

    def calibration_params(
        self,
        run_id: int,
        *,
        usable_only: bool = True,
        kind: str | None = None,
        params: Iterable[str] | None = None,
    ) -> dict[ParamKey, float]:
        """``(kind, id, param) -> value`` of one run: the usable values (``usable_only``), or
        every non-null one; optionally one device ``kind`` and a subset of ``params``."""
        extra, args = _filters(kind, params)
        if usable_only:
            extra += " AND usable"
        rows = self.con.execute(
            "SELECT kind, id, param, value FROM calibration_params"
            f" WHERE run_id = ? AND value IS NOT NULL{extra}",
            [run_id, *args],
        ).fetchall()
        return {(k, i, p): float(v) for k, i, p, v in rows}

    def latest_calibration_params(
        self,
        *,
        usable_only: bool = True,
        kind: str | None = None,
        params: Iterable[str] | None = None,
    ) -> dict[ParamKey, float]:
        """:meth:`calibration_params` of the newest run; empty before the first calibration."""
        run_id = self.latest_calibration_run_id()
        if run_id is None:
            return {}
        return self.calibration_params(run_id, usable_only=usable_only, kind=kind, params=params)

    def calibration_param_rows(self, run_id: int) -> list[dict[str, Any]]:
        """Every parameter row of one run, usable or not, with its stderr and reason."""
        rows = self.con.execute(
            f"SELECT {', '.join(PARAM_COLUMNS)} FROM calibration_params WHERE run_id = ?",
            [run_id],
        ).fetchall()
        return [dict(zip(PARAM_COLUMNS, r, strict=True)) for r in rows]

    def calibration_param_medians(self, kind: str, param: str) -> dict[str, float]:
        """id -> the median of its usable values of ``param`` over the runs fitted on this
        store's telemetry (its history; a seeded run is another recording's, not this site's).

        Kept until a newer run is stored: a detection pass asks twice (headroom and hot spots),
        and the aggregate grows with every run's rows."""
        newest = self.latest_calibration_run_id()
        cache: dict[tuple[str, str], tuple[int | None, dict[str, float]]]
        cache = self.__dict__.setdefault("_param_medians", {})
        hit = cache.get((kind, param))
        if hit is not None and hit[0] == newest:
            return dict(hit[1])
        rows = self.con.execute(
            "SELECT id, median(value) FROM calibration_params p JOIN calibration_runs r"
            " USING (run_id) WHERE kind = ? AND param = ? AND usable AND value IS NOT NULL"
            " AND coalesce(r.source, 'fit') = 'fit' GROUP BY id",
            [kind, param],
        ).fetchall()
        out = {i: float(v) for i, v in rows}
        cache[(kind, param)] = (newest, out)
        return dict(out)

    def gpu_thermal_fits(self, run_id: int, params: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Each GPU's newest usable thermal fit on this store's telemetry as of run ``run_id``
        (its R usable in that run or the latest fit run before it that had one): id ->
        ``run_id`` (the fit's), ``params`` (name -> value, the usable ones of ``params`` of
        that run), ``mae`` (that run's held-out temperature MAE, None without one) and
        ``mae_median`` (the median of its held-out temperature MAEs over its usable fits up to
        ``run_id``). A GPU with no usable fit on this store is absent.

        Kept for the newest ``run_id`` asked, per ``params`` (runs are only ever added, so the
        answer for a run never changes; the entries are shared: read them, do not change
        them): a detection pass asks every minute, twice (the residual's inputs and the fit
        standing), and the join grows with every run's rows."""
        cache: dict[tuple[int, tuple[str, ...]], dict[str, dict[str, Any]]]
        cache = self.__dict__.get("_thermal_fits", {})
        key = (run_id, tuple(params))
        hit = cache.get(key)
        if hit is not None:
            return dict(hit)
        rows = self.con.execute(
            "WITH fits AS (SELECT p.id, p.run_id FROM calibration_params p"
            " JOIN calibration_runs r USING (run_id) WHERE p.kind = 'gpu'"
            " AND p.param = 'r_k_per_w' AND p.usable AND p.value IS NOT NULL"
            " AND coalesce(r.source, 'fit') = 'fit' AND p.run_id <= ?),"
            " q AS (SELECT id, run_id, min(mae) AS mae FROM calibration_quality"
            " WHERE kind = 'gpu' AND starts_with(quantity, 'temp_c@') AND mae IS NOT NULL"
            " GROUP BY id, run_id),"
            " hist AS (SELECT f.id, max(f.run_id) AS run_id, median(q.mae) AS mae_median"
            " FROM fits f LEFT JOIN q USING (id, run_id) GROUP BY f.id)"
            " SELECT h.id, h.run_id, h.mae_median, q.mae, p.param, p.value FROM hist h"
            " LEFT JOIN q USING (id, run_id)"
            " JOIN calibration_params p ON p.id = h.id AND p.run_id = h.run_id"
            " AND p.kind = 'gpu' AND p.usable AND p.value IS NOT NULL"
            " AND list_contains(?, p.param)",
            [run_id, list(params)],
        ).fetchall()
        out: dict[str, dict[str, Any]] = {}
        for gid, run, mae_med, mae, param, value in rows:
            fit = out.setdefault(
                gid,
                {
                    "run_id": int(run),
                    "params": {},
                    "mae": None if mae is None else float(mae),
                    "mae_median": None if mae_med is None else float(mae_med),
                },
            )
            fit["params"][param] = float(value)
        # a new dict, never one changed in place (another thread may be reading the old one);
        # an older run's answers are not asked again
        self.__dict__["_thermal_fits"] = {
            **{k: v for k, v in cache.items() if k[0] == run_id},
            key: out,
        }
        return dict(out)

    def gpu_fit_standing(self, run_id: int) -> tuple[dict[str, str], dict[str, int]]:
        """Which GPUs run ``run_id`` cannot judge by its own thermal fit: those whose fit it
        refused and that have no earlier usable fit on this store (id -> the refusal's reason:
        not judged), and those judged by an earlier fit, their fit in this run refused or not
        made (id -> that fit's run; :meth:`gpu_thermal_fits`). Kept for the newest run asked,
        as :meth:`gpu_thermal_fits` is (a run's rows never change once stored)."""
        hit = self.__dict__.get("_fit_standing")
        if hit is not None and hit[0] == run_id:
            return dict(hit[1]), dict(hit[2])
        fits = self.gpu_thermal_fits(run_id, ("r_k_per_w",))
        refused = {
            row["id"]: row["reason"] or "fit refused"
            for row in self.calibration_param_rows(run_id)
            if row["kind"] == "gpu"
            and row["param"] == "r_k_per_w"
            and not row["usable"]
            and row["id"] not in fits
        }
        earlier = {gid: f["run_id"] for gid, f in fits.items() if f["run_id"] != run_id}
        self.__dict__["_fit_standing"] = (run_id, refused, earlier)
        return dict(refused), dict(earlier)

    def calibration_quality(self, run_id: int, *, kind: str | None = None) -> list[dict[str, Any]]:
        """Fit quality rows of one run (MAE, CV(RMSE), NMBE, MAPE, n per device and quantity)."""
        extra, args = _filters(kind, None)
        rows = self.con.execute(
            f"SELECT {', '.join(QUALITY_COLUMNS)} FROM calibration_quality WHERE run_id = ?{extra}",
            [run_id, *args],
        ).fetchall()
        return [dict(zip(QUALITY_COLUMNS, r, strict=True)) for r in rows]

    def calibration_events(self, run_id: int, *, kind: str | None = None) -> list[dict[str, Any]]:
        """Drift events of one run, by kind and id."""
        extra, args = _filters(kind, None)
        rows = self.con.execute(
            f"SELECT {', '.join(EVENT_COLUMNS)} FROM calibration_events"
            f" WHERE run_id = ?{extra} ORDER BY kind, id",
            [run_id, *args],
        ).fetchall()
        return [dict(zip(EVENT_COLUMNS, r, strict=True)) for r in rows]

    def calibration_class_stats(
        self, run_id: int, device_class: Mapping[str, str]
    ) -> dict[str, list[tuple[Any, ...]]]:
        """One run's parameters and fit quality aggregated per device class.

        ``device_class`` maps GPU ids to a class (``gpu:<model>``); a GPU without one is
        ``gpu``, other devices are their kind. Returns lists of tuples under ``params``
        (class, param, median, p10, p90, n over usable values), ``usable`` (class, devices,
        usable share), ``reasons`` (class, reason, count of unusable rows) and ``quality``
        (class, quantity, median MAE, CV(RMSE), NMBE, MAPE, devices).
        """
        cls_sql = "CASE WHEN kind = 'gpu' THEN coalesce(cls, 'gpu') ELSE kind END"
        cmap = "(SELECT unnest(?) AS id, unnest(?) AS cls)"
        cargs: list[Any] = [list(device_class) or [""], list(device_class.values()) or [""]]
        con = self.con
        return {
            "params": con.execute(
                f"SELECT {cls_sql} AS c, param, median(value) FILTER (WHERE usable),"
                " quantile_cont(value, 0.1) FILTER (WHERE usable),"
                " quantile_cont(value, 0.9) FILTER (WHERE usable),"
                " count(value) FILTER (WHERE usable)"
                f" FROM calibration_params p LEFT JOIN {cmap} USING (id) WHERE run_id = ?"
                " GROUP BY c, param ORDER BY c, param",
                [*cargs, run_id],
            ).fetchall(),
            "usable": con.execute(
                f"SELECT {cls_sql} AS c, count(DISTINCT id), avg(CAST(usable AS DOUBLE))"
                f" FROM calibration_params p LEFT JOIN {cmap} USING (id) WHERE run_id = ?"
                " GROUP BY c",
                [*cargs, run_id],
            ).fetchall(),
            "reasons": con.execute(
                f"SELECT {cls_sql} AS c, reason, count(*) FROM calibration_params p"
                f" LEFT JOIN {cmap} USING (id) WHERE run_id = ? AND NOT usable"
                " GROUP BY c, reason",
                [*cargs, run_id],
            ).fetchall(),
            "quality": con.execute(
                f"SELECT {cls_sql} AS c, quantity, median(mae), median(cv_rmse), median(nmbe),"
                f" median(mape), count(*) FROM calibration_quality q LEFT JOIN {cmap} USING (id)"
                " WHERE run_id = ? GROUP BY c, quantity ORDER BY c, quantity",
                [*cargs, run_id],
            ).fetchall(),
        }

    # ---- writes --------------------------------------------------------------------------

    def save_calibration_run(
        self,
        run: Mapping[str, Any],
        params: Sequence[Mapping[str, Any]],
        quality: Sequence[Mapping[str, Any]],
        events: Sequence[Mapping[str, Any]],
    ) -> int:
        """Store one run as a new version, all of it or nothing; returns its run id.

        ``run`` holds the columns of ``calibration_runs`` but ``run_id`` (``source`` defaults
        to ``"fit"``, ``seeded_from`` and ``seeded_at`` to None); each row of ``params``,
        ``quality`` and ``events`` the columns of its table but ``run_id`` (keys the table
        does not have are left out).
        """
        run = {"source": "fit", "seeded_from": None, "seeded_at": None, **run}
        if run["source"] not in RUN_SOURCES:
            raise ValueError(f"calibration run source {run['source']!r}: expected fit or seed")
        con = self.con
        con.execute("BEGIN TRANSACTION")
        try:
            run_id = int(
                con.execute("SELECT coalesce(max(run_id), 0) + 1 FROM calibration_runs").fetchall()[
                    0
                ][0]
            )
            con.execute(
                f"INSERT INTO calibration_runs ({', '.join(RUN_COLUMNS)})"
                f" VALUES ({', '.join('?' * len(RUN_COLUMNS))})",
                [run_id, *(run[c] for c in RUN_COLUMNS[1:])],
            )
            for table, columns, rows in (
                ("calibration_params", PARAM_COLUMNS, params),
                ("calibration_quality", QUALITY_COLUMNS, quality),
                ("calibration_events", EVENT_COLUMNS, events),
            ):
                if not rows:
                    continue
                cols = [c for c in columns if c in rows[0]]
                data = {"run_id": [run_id] * len(rows)}
                data.update({c: [row.get(c) for row in rows] for c in cols})
                con.register("_cal_batch", pa.table(data))
                # table: one of three fixed names
                con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _cal_batch")
                con.unregister("_cal_batch")
            con.execute("COMMIT")
        except Exception:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            with contextlib.suppress(duckdb.Error, KeyError):
                con.unregister("_cal_batch")
            raise
        return run_id
