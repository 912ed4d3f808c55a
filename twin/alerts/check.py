"""Check a rule file as ``promtool check rules`` does, and list the limits it leaves uncovered.

:func:`check_rules` (behind ``dctwin rules check FILE``) first validates the file with
:func:`twin.alerts.rules.load_rules`: YAML, every field, metrics and the entity kinds they are
emitted for (:data:`twin.alerts.metrics.METRICS`), label names, inhibitions that name an
unknown rule or the rule itself. An invalid file stops there, its problems naming file, rule
and field.

A valid file is then judged for **coverage**. Every kind of physical limit the twin forecasts
(:data:`LIMITS`) has two metrics: a *breached-now* one (headroom left now) and a *forecast*
one (time until the forecast crosses the limit). A limit is covered twice when the file has

- a ``threshold`` rule on its breached-now metric (sudden steps, and whenever no forecast
  exists), and
- a ``forecast_breach`` rule on its forecast metric (lead time);

the report says which half is missing for each limit that lacks one. A forecast rule that no
breached-now rule of its limit inhibits is a warning: once the limit is crossed both page.

Exit codes (:attr:`CheckReport.exit_code`): :data:`EXIT_OK` 0 valid and every limit covered,
:data:`EXIT_INVALID` 1 the file is refused, :data:`EXIT_UNCOVERED` 3 valid but some limit is
uncovered (2 is the command line's own usage error). Warnings never change the exit code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from twin.alerts import metrics as mt
from twin.alerts.hooks import Router, validate_hook_file
from twin.alerts.model import EntityKind
from twin.alerts.rules import Rule, RuleFileError, RuleIssue, RuleSet, load_rules

__all__ = [
    "EXIT_INVALID",
    "EXIT_OK",
    "EXIT_UNCOVERED",
    "LIMITS",
    "CheckReport",
    "Coverage",
    "LimitKind",
    "check_routing",
    "check_rule_set",
    "check_rules",
]

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_UNCOVERED = 3


@dataclass(frozen=True)
class LimitKind:
    """One kind of limit: its breached-now and forecast metrics, on one entity kind."""

    name: str
    title: str
    entity_kind: EntityKind
    now_metric: str
    forecast_metric: str


#: Every kind of limit the twin forecasts, with the metric pair that covers it.
LIMITS: tuple[LimitKind, ...] = (
    LimitKind(
        "gpu_temp",
        "GPU temperature",
        "gpu",
        mt.HEADROOM_GPU_K_TO_SLOWDOWN,
        mt.HEADROOM_GPU_TIME_TO_BREACH_P90_S,
    ),
    LimitKind(
        "pdu_phase",
        "PDU phase and breaker",
        "pdu_phase",
        mt.HEADROOM_PDU_PHASE_A_TO_LIMIT,
        mt.HEADROOM_PDU_PHASE_TIME_TO_BREACH_P50_S,
    ),
    LimitKind(
        "rack_feed",
        "rack feed",
        "rack",
        mt.HEADROOM_RACK_KW_TO_LIMIT,
        mt.HEADROOM_RACK_TIME_TO_BREACH_P50_S,
    ),
    LimitKind(
        "cdu_heat",
        "CDU heat",
        "cdu",
        mt.HEADROOM_CDU_FREE_FRACTION,
        mt.HEADROOM_CDU_TIME_TO_BREACH_P50_S,
    ),
    LimitKind(
        "cdu_flow",
        "CDU flow",
        "cdu",
        mt.HEADROOM_CDU_FLOW_LPM_TO_LIMIT,
        mt.HEADROOM_CDU_FLOW_TIME_TO_BREACH_P50_S,
    ),
    LimitKind(
        "loop_return",
        "loop return temperature",
        "cdu",
        mt.HEADROOM_LOOP_K_TO_RETURN_LIMIT,
        mt.HEADROOM_LOOP_TIME_TO_BREACH_P50_S,
    ),
    LimitKind(
        "link",
        "network link",
        "link",
        mt.HEADROOM_LINK_GBPS_TO_LIMIT,
        mt.HEADROOM_LINK_TIME_TO_BREACH_P50_S,
    ),
)


@dataclass(frozen=True)
class Coverage:
    """One limit kind: the rules that cover each half."""

    limit: LimitKind
    now_rules: tuple[str, ...]
    forecast_rules: tuple[str, ...]

    @property
    def missing(self) -> list[str]:
        """The halves without a rule: ``breached-now``, ``forecast``."""
        out = []
        if not self.now_rules:
            out.append("breached-now")
        if not self.forecast_rules:
            out.append("forecast")
        return out

    @property
    def covered(self) -> bool:
        return not self.missing

    def to_json(self) -> dict[str, Any]:
        lim = self.limit
        return {
            "limit": lim.name,
            "title": lim.title,
            "entity_kind": lim.entity_kind,
            "now_metric": lim.now_metric,
            "forecast_metric": lim.forecast_metric,
            "now_rules": list(self.now_rules),
            "forecast_rules": list(self.forecast_rules),
            "covered": self.covered,
            "missing": self.missing,
        }


@dataclass
class CheckReport:
    """What :func:`check_rules` found: errors (the file is refused), warnings, coverage."""

    path: str
    rules: int = 0
    errors: list[RuleIssue] = field(default_factory=list)
    error_text: str = ""
    warnings: list[RuleIssue] = field(default_factory=list)
    coverage: list[Coverage] = field(default_factory=list)
    #: where each severity goes (the hook file's route), when a hook file was checked
    routing: list[dict[str, Any]] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.errors

    @property
    def uncovered(self) -> list[Coverage]:
        return [c for c in self.coverage if not c.covered]

    @property
    def exit_code(self) -> int:
        if not self.valid:
            return EXIT_INVALID
        return EXIT_UNCOVERED if self.uncovered else EXIT_OK

    def to_json(self) -> dict[str, Any]:
        def issue(i: RuleIssue) -> dict[str, Any]:
            return {"rule": i.rule or None, "field": i.field or None, "message": i.message}

        return {
            "file": self.path,
            "valid": self.valid,
            "rules": self.rules,
            "errors": [{**issue(i), "line": i.line} for i in self.errors],
            "warnings": [issue(i) for i in self.warnings],
            "coverage": [c.to_json() for c in self.coverage],
            "uncovered": [c.limit.name for c in self.uncovered],
            "routing": self.routing,
            "exit_code": self.exit_code,
        }


#: The tree a limit's inhibition naturally runs along (the same entity is under itself in both).
_ALONG = {
    "gpu": "cooling",
    "cdu": "cooling",
    "pdu_phase": "power",
    "rack": "power",
    "link": "power",
}


def _on(rule: Rule, metric: str, kind: str, rule_type: str) -> bool:
    return rule.type == rule_type and rule.metric == metric and rule.entity_kind == kind


def check_rule_set(rules: RuleSet) -> tuple[list[Coverage], list[RuleIssue]]:
    """Coverage of every :data:`LIMITS` kind by a validated rule set, and the warnings."""
    coverage: list[Coverage] = []
    warnings: list[RuleIssue] = []
    for lim in LIMITS:
        now = [r for r in rules if _on(r, lim.now_metric, lim.entity_kind, "threshold")]
        fc = [r for r in rules if _on(r, lim.forecast_metric, lim.entity_kind, "forecast_breach")]
        coverage.append(Coverage(lim, tuple(r.name for r in now), tuple(r.name for r in fc)))
        for f in fc:
            if not any(i.rule == f.name for r in now for i in r.inhibits):
                warnings.append(
                    RuleIssue(
                        repr(f.name),
                        "",
                        f"no breached-now rule on {lim.now_metric} inhibits this forecast"
                        " rule: once the limit is crossed, both page (add"
                        f" `inhibits: [{{rule: {f.name}, along: {_ALONG[lim.entity_kind]}}}]`"
                        " to the threshold rule)",
                    )
                )
    return coverage, warnings


def check_routing(rules: RuleSet, router: Router) -> tuple[list[dict[str, Any]], list[RuleIssue]]:
    """Where each severity, and each rule, goes: (per-severity rows, warnings). The router
    was validated already (info never reaches a receiver that pages); this adds each rule's
    own route (its labels matched too) and warns when there is no route at all."""
    rows = router.describe()
    warnings: list[RuleIssue] = []
    if router.route is None:
        warnings.append(
            RuleIssue(
                "",
                "route",
                "no route: every notification goes to every hook, info included (add"
                " receivers and a route that sends severity info to a ticket receiver)",
            )
        )
        return rows, warnings
    for r in rules:
        rec = router.receiver_for({**r.labels, "severity": r.severity, "rule": r.name})
        assert rec is not None
        if r.severity == "info" and rec.pages:  # a route on a rule label the tree let through
            warnings.append(
                RuleIssue(repr(r.name), "severity", f"info, routed to {rec.name!r}, which pages")
            )
    return rows, warnings


def check_rules(path: str | Path, hooks: str | Path | None = None) -> CheckReport:
    """Validate a rule file (and a hook file's hooks, receivers and route, when given or when
    the rule file holds them) and judge its coverage; never raises for a bad file."""
    report = CheckReport(str(path))
    try:
        rules = load_rules(path)
        router = _router(path, hooks)
    except RuleFileError as exc:
        report.errors, report.error_text = list(exc.issues), str(exc)
        return report
    report.rules = len(rules)
    report.coverage, report.warnings = check_rule_set(rules)
    if router is not None:
        report.routing, more = check_routing(rules, router)
        report.warnings += more
    return report


def _router(path: str | Path, hooks: str | Path | None) -> Router | None:
    """The router of ``hooks`` or, without one, of the rule file when it holds hooks."""
    if hooks is not None:
        return validate_hook_file(hooks)
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))  # load_rules read it already
    if isinstance(data, dict) and ({"hooks", "route", "receivers"} & set(data)):
        return validate_hook_file(path)
    return None
