"""What-if jobs over the API: run scenarios on a recorded bundle in the service, in the
background, and read their results and reports.

- ``GET /api/v1/whatif``: the bundles and scenarios the service knows, and every job.
- ``POST /api/v1/whatif`` (token): ``{"bundle": NAME, "scenarios": [NAME, ...]}`` starts a job.
- ``GET /api/v1/whatif/{job}``: its state and, once done, the baseline and scenario results.
- ``GET /api/v1/whatif/{job}/report.html`` and ``/report.md``: the report.
- ``GET /api/v1/whatif/{job}/figures``: the report's figures as plotly JSON (the console draws
  them), ``[{"key", "title", "figure"}]``.

Bundles are the directories holding a ``manifest.json`` under the bundle directory; scenarios
the ``*.yaml`` files of the scenario directory (both given to ``dctwin serve``). The alerts a
job lists are those of the service's own rule file (``serve --rules``), read when the job
runs (a SIGHUP's reload counts); a service without one lists none. Each job says which file
it used in ``rules``. Jobs run one at
a time in a worker thread; the what-if never touches the live store. At most ``max_pending``
jobs wait or run (a start beyond gets 429 with Retry-After); the newest ``max_kept`` jobs are
kept, with their reports (older finished ones are forgotten and their reports deleted).

A service offers the routes when its :class:`~twin.api.context.ApiContext` has ``whatif``
(:class:`WhatifSettings`): :func:`twin.api.app.create_app` then keeps one :class:`WhatifJobs`
in ``app.state.whatif``, and the routes reach it by dependency (:func:`get_jobs`), so two apps
never share jobs.
"""

from __future__ import annotations

import logging
import shutil
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field

from twin.api.deps import V1, WRITER

log = logging.getLogger(__name__)

#: Jobs queued or running at once; one more start is answered 429.
MAX_PENDING_JOBS = 4
#: Jobs remembered (with their reports on disk); the oldest finished beyond are dropped.
MAX_KEPT_JOBS = 50
#: Retry-After of a refused start [s].
RETRY_AFTER_S = 30


class WhatifRequest(BaseModel):
    bundle: str = Field(description="a bundle name from GET /api/v1/whatif")
    scenarios: list[str] = Field(min_length=1, max_length=20, description="scenario names")


class WhatifJob(BaseModel):
    job: str
    bundle: str
    scenarios: list[str]
    state: Literal["queued", "running", "done", "failed"]
    created_at: datetime
    finished_at: datetime | None = None
    error: str | None = None
    #: the alert rule file the job evaluated (the service's --rules), None: no alerts
    rules: str | None = None
    verdicts: dict[str, str] = Field(default_factory=dict)
    results: list[dict[str, Any]] | None = None


class WhatifIndex(BaseModel):
    bundles: list[str]
    scenarios: list[str]
    reports: list[WhatifJob]


def _run_job(
    bundle: Path, scenario_paths: list[Path], rules: Path | None, out: Path
) -> list[dict[str, Any]]:
    """The baseline and each scenario on the bundle, the report written into ``out``; the
    results as JSON (baseline first)."""
    from twin.alerts import load_rules
    from twin.replay.bundle import Bundle
    from twin.replay.report import write_report
    from twin.replay.scenario import load_scenario
    from twin.replay.whatif import load, run_all

    b = Bundle.load(bundle)
    loaded = [load_scenario(p, b.site) for p in scenario_paths]
    rule_set = load_rules(rules) if rules is not None else None
    base, runs = run_all(load(b), loaded, rule_set)
    write_report(b, base, runs, out)
    return [r.model_dump(mode="json", exclude={"gpu_mean_temp_c"}) for r in [base, *runs]]


@dataclass(frozen=True)
class WhatifSettings:
    """Where a service's what-if jobs read bundles (``bundle_dir``) and scenarios
    (``scenario_dir``) and write their reports (``out_dir``); the alerts from the rule file
    ``rules`` (None: no alerts); see the module docstring for ``max_pending`` and
    ``max_kept``."""

    bundle_dir: Path
    scenario_dir: Path
    out_dir: Path
    rules: Path | None = None
    max_pending: int = MAX_PENDING_JOBS
    max_kept: int = MAX_KEPT_JOBS


class WhatifJobs:
    """One app's what-if jobs: started, run one at a time in worker threads, listed, and
    forgotten beyond ``max_kept`` (see the module docstring)."""

    def __init__(self, settings: WhatifSettings) -> None:
        self.settings = settings
        self._jobs: dict[str, WhatifJob] = {}
        self._lock = threading.Lock()
        self._queue = threading.Lock()  # one job at a time: each holds a day of a site in memory

    def bundles(self) -> dict[str, Path]:
        d = self.settings.bundle_dir
        if not d.is_dir():
            return {}
        return {p.parent.name: p.parent for p in sorted(d.glob("*/manifest.json"))}

    def scenarios(self) -> dict[str, Path]:
        d = self.settings.scenario_dir
        if not d.is_dir():
            return {}
        return {p.stem: p for p in sorted(d.glob("*.yaml"))}

    def index(self) -> WhatifIndex:
        """The bundles, the scenarios and the jobs (newest first, without their results)."""
        with self._lock:
            reports = [j.model_copy(update={"results": None}) for j in self._jobs.values()]
        reports.sort(key=lambda j: j.created_at, reverse=True)
        return WhatifIndex(
            bundles=list(self.bundles()), scenarios=list(self.scenarios()), reports=reports
        )

    def start(self, req: WhatifRequest) -> WhatifJob:
        """Queue a job and start its worker thread; 404 for an unknown bundle or scenario,
        429 while ``max_pending`` jobs wait or run."""
        bundles, scenarios = self.bundles(), self.scenarios()
        if req.bundle not in bundles:
            raise HTTPException(404, f"no bundle {req.bundle!r}; there are {list(bundles)}")
        unknown = [s for s in req.scenarios if s not in scenarios]
        if unknown:
            raise HTTPException(404, f"no scenario {unknown}; there are {list(scenarios)}")
        rules = self.settings.rules
        job = WhatifJob(
            job=uuid.uuid4().hex[:12],
            bundle=req.bundle,
            scenarios=req.scenarios,
            state="queued",
            created_at=datetime.now(UTC),
            rules=None if rules is None else str(rules),
        )
        max_pending = self.settings.max_pending
        with self._lock:
            pending = sum(1 for j in self._jobs.values() if j.state in ("queued", "running"))
            if pending >= max_pending:
                raise HTTPException(
                    429,
                    f"busy: {pending} what-if jobs are queued or running (at most"
                    f" {max_pending}); retry in {RETRY_AFTER_S} s",
                    headers={"Retry-After": str(RETRY_AFTER_S)},
                )
            self._jobs[job.job] = job
            self._forget_old()
        name = f"whatif-{job.job}"
        threading.Thread(target=self._work, args=(job,), name=name, daemon=True).start()
        return job

    def get(self, job: str) -> WhatifJob:
        """The job ``job``; 404 when there is none (or it was forgotten)."""
        with self._lock:
            found = self._jobs.get(job)
        if found is None:
            raise HTTPException(404, f"no what-if job {job!r}")
        return found

    def output(self, job: str, name: str, what: str) -> Path:
        """The file ``name`` the finished job ``job`` wrote; 404 without the job, 409 while
        it has not written it (``what`` names it in the answer)."""
        j = self.get(job)
        path = self.settings.out_dir / j.job / name
        if j.state != "done" or not path.is_file():
            raise HTTPException(409, f"job {job} is {j.state}: no {what} yet")
        return path

    def _forget_old(self) -> None:
        """Drop the oldest finished jobs beyond ``max_kept`` (caller holds the lock)."""
        done = sorted(
            (j for j in self._jobs.values() if j.state in ("done", "failed")),
            key=lambda j: j.created_at,
        )
        for j in done[: max(0, len(self._jobs) - self.settings.max_kept)]:
            del self._jobs[j.job]
            shutil.rmtree(self.settings.out_dir / j.job, ignore_errors=True)

    def _work(self, job: WhatifJob) -> None:
        from twin.alerts import RuleFileError
        from twin.replay.bundle import BundleError
        from twin.replay.scenario import ScenarioError

        with self._queue:
            with self._lock:
                job.state = "running"
            try:
                paths = [self.scenarios()[s] for s in job.scenarios]
                out = self.settings.out_dir / job.job
                results = _run_job(self.bundles()[job.bundle], paths, self.settings.rules, out)
                with self._lock:
                    job.results = results
                    job.verdicts = {r["name"]: r["verdict"] for r in results[1:]}
                    job.state = "done"
            except (BundleError, ScenarioError, RuleFileError, ValueError, OSError) as e:
                with self._lock:
                    job.state, job.error = "failed", str(e)
            except Exception as e:  # the job fails, never the service
                log.exception("what-if job %s failed", job.job)
                with self._lock:
                    job.state, job.error = "failed", f"{type(e).__name__}: {e}"
            finally:
                job.finished_at = datetime.now(UTC)


def get_jobs(request: Request) -> WhatifJobs:
    """The dependency of the what-if routes: the jobs of the app serving the request."""
    return request.app.state.whatif


Jobs = Annotated[WhatifJobs, Depends(get_jobs)]

router = APIRouter(prefix=f"{V1}/whatif", tags=["what-if"])


@router.get("", response_model=WhatifIndex)
def index(jobs: Jobs) -> WhatifIndex:
    """The bundles and scenarios this service can run, and its jobs (newest first)."""
    return jobs.index()


@router.post(
    "",
    response_model=WhatifJob,
    status_code=202,
    responses={429: {"description": "too many jobs waiting: retry after Retry-After s"}},
    dependencies=WRITER,
)
def start(req: WhatifRequest, jobs: Jobs) -> WhatifJob:
    """Start a job: the baseline and each scenario on the bundle (token required)."""
    return jobs.start(req)


@router.get("/{job}", response_model=WhatifJob)
def status(job: str, jobs: Jobs) -> WhatifJob:
    """A job's state and, once done, its results (baseline first)."""
    return jobs.get(job)


@router.get("/{job}/report.{ext}")
def report(job: str, ext: Literal["html", "md"], jobs: Jobs) -> FileResponse:
    """The job's report (HTML with plots, or Markdown)."""
    path = jobs.output(job, f"report.{ext}", "report")
    media = "text/html" if ext == "html" else "text/markdown"
    return FileResponse(path, media_type=media)


@router.get("/{job}/figures")
def figures(job: str, jobs: Jobs) -> FileResponse:
    """The report's figures, one per quantity, as plotly JSON: ``[{"key", "title",
    "figure"}]`` (twin.replay.report.figures_json; report.html draws the same)."""
    path = jobs.output(job, "figures.json", "figures")
    return FileResponse(path, media_type="application/json")
