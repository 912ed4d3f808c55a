"""Alert rules in YAML, validated by pydantic; a bad file is refused whole with its rule named.

A rule file::

    rules:
      - name: gpu_temp_high              # unique; the Alertmanager alertname
        type: threshold                  # threshold | forecast_breach | residual | drift
                                         # | fleet_underuse
        metric: headroom.gpu.k_to_slowdown  # Observation.metric it watches (twin.alerts.metrics)
        entity_kind: gpu                 # Observation.entity_kind it watches
        op: "<="                         # > >= < <=
        value: 3                         # fires when `value op threshold` holds ...
        clear_value: 6                   # ... and resolves only once past this (hysteresis)
        for_s: 60                        # the condition must hold this long first
        severity: warning                # critical | warning | info
        group_by: rack                   # none | node | rack | cdu | pdu | fleet
        group_wait_s: 0                  # hold a new group's first page to gather members
        resolve_if_absent_s: null        # resolve when the entity reports nothing this long
        keep_firing_for_s: 0             # once firing, stay firing this long after it clears
        repeat_interval_s: null          # remind: re-send the firing page this often
        recur_as_ticket_s: null          # a recurring state: paged once, then within this
                                         # window at most one ticket (info) per window
        flap_changes: null               # flap detection: this many state changes ...
        flap_window_s: 3600              # ... within this window mark the incident flapping
        flap_stable_s: null              # a flapping incident resolves once clear this long
                                         # (default: flap_window_s)
        min_excess_k: 3                  # residual and R drift: the excess the value stands
                                         # for, in K, must reach this too (residual default
                                         # 3 K; physics §2.7, §2.6)
        runbook_url: https://wiki.example.com/runbooks/gpu_temp_high  # sent with every page
        summary: "GPU {entity_id} {value:.1f} K from slowdown"
        labels: {team: facilities}       # static labels, carried into every payload; names
                                         # match [a-zA-Z_][a-zA-Z0-9_]* (Prometheus rule)
        inhibits:                        # while this rule fires for X, mute rule `r` below X
          - {rule: other_rule, along: cooling, hold_s: 300}   # along: cooling | power;
                                         # hold_s: keep muting while the effect decays

Types set validation and defaults; evaluation is the same for all (one state machine in
:mod:`twin.alerts.engine`):

- ``threshold``: as written.
- ``forecast_breach``: a time-to-breach metric under a horizon; ``horizon_s`` is required,
  ``op`` defaults to ``<=`` and ``value`` to ``horizon_s``.
- ``residual``: a k-sigma residual held ``for_s`` (m minutes); ``op`` must be ``>``/``>=``;
  it fires only where the excess over the model is also at least ``min_excess_k`` kelvin
  (default :data:`twin.alerts.metrics.RESIDUAL_MIN_EXCESS_K`): k sigma alone pages a
  fraction of a kelvin where sigma is small.
- ``min_excess_k`` is also taken by a ``drift`` rule on ``drift.gpu.r_k_per_w``, whose
  observations carry (R - the fleet's median) x the heat R was estimated at, in K (no
  default: a rule without it judges the relative drift alone).
- ``fleet_underuse`` takes ``min_coverage_s``: a fleet is judged only once its figures cover
  that many seconds of data (until then it neither fires nor clears).
- ``drift`` and ``fleet_underuse``: event-like observations (a calibration drift event, an
  underused fleet); ``op`` defaults to ``>``, ``value`` to 0 (any positive value fires);
  set ``resolve_if_absent_s`` when the detector only reports while the event holds.
  ``fleet_underuse`` watches ``entity_kind: fleet`` by default.

**One incident per fault** (:mod:`twin.alerts.engine` has the details; keep-firing and flap
times are measured on observation timestamps, as ``for_s`` is, reminders on the evaluation's
time, which a replay sets to the recorded time):

- ``keep_firing_for_s`` (Prometheus ``keep_firing_for``): once firing, an alert whose value
  goes past ``clear_value`` (or that goes absent for ``resolve_if_absent_s``) stays firing this
  long; back on the alert side of ``clear_value`` within it, the same alert and incident go on
  (no new page, no resolve). Default 0: it resolves at once.
- ``repeat_interval_s`` (Alertmanager ``repeat_interval``): while an incident stays firing and
  is neither muted, acknowledged nor flapping, its page is re-sent every interval with the same
  dedup key, ``status: firing`` and ``repeat: 1, 2, ...`` (each reminder its own
  ``event_id``). Default: no reminders.
- Flap detection, off by default (``flap_changes: null``): the incident's state changes (it
  fires: some member breached; it clears: none is) are counted over ``flap_window_s``; at the
  ``flap_changes``-th the incident is marked ``flapping`` (a field of its notifications and of
  the API's open incidents), gets no reminders, and resolves once only, after staying clear
  ``flap_stable_s`` (default ``flap_window_s``); a re-breach before then continues it. A
  flapping incident therefore gives at most two notifications (firing, resolved). Incidents
  that resolved before the count was reached were paged as usual: with ``keep_firing_for_s``
  the short clears never resolve, so the changes all fall in one incident. Suggested:
  ``flap_changes: 4`` in ``flap_window_s: 3600``. Once a flapping incident resolves, its count
  starts again.

Summary templates are :meth:`str.format` strings over ``rule``, ``entity_kind``,
``entity_id``, ``value``, ``threshold``, ``severity``, ``group_kind``, ``group_id``,
``count`` (members) and ``labels`` (``{labels[kw_freed]}``): the worst member's observation
labels; a summary may quote only the labels its metric always carries
(:data:`twin.alerts.metrics.METRICS`, ``MetricSpec.labels``), else the rule is refused.

``metric`` must be one of :data:`twin.alerts.metrics.METRICS` (what the detectors and what-if
emit) and ``entity_kind`` one the metric is emitted for: a rule that could never fire is refused.

Label names (the keys of ``labels``) must match ``[a-zA-Z_][a-zA-Z0-9_]*``, the Prometheus
label name rule that Alertmanager enforces on every label and annotation name: Alertmanager
answers 400 to an alert with ``on-call`` or ``team.name``, and a 400 is not retried, so such a
page would be lost. A rule has no annotations of its own: the Alertmanager hook's annotation
names are fixed (``summary``, ``description``, ``members``) or are observation label names,
which :class:`twin.alerts.model.Observation` checks by the same rule.

Errors raise :class:`RuleFileError`; its message names the file, the rule (by name, else by
index) and the field::

    rules.yaml: rule 'gpu_temp' (rules[0]): op: Input should be '>', '>=', '<' or '<='
    rules.yaml: rule 'gpu_hot' (rules[1]): metric: unknown metric 'gpu.temp'; known metrics: ...
    rules.yaml: rule 'gpu_hot' (rules[1]): labels: label name 'on-call' is not valid ...
    rules.yaml: rule 'cdu_pump_lost' (rules[3]): inhibits[0].rule: a rule cannot inhibit itself ...

``dctwin rules check FILE`` (:mod:`twin.alerts.check`) runs the same validation and then lists
the kinds of limit the file leaves uncovered.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import string
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from twin.alerts.metrics import EXCESS_METRICS, METRICS, RESIDUAL_MIN_EXCESS_K, metric_problem
from twin.alerts.model import EntityKind, LabelSet, Severity
from twin.redact import parse_error_text, redact_text, register_config_secrets

__all__ = [
    "OPS",
    "InhibitRule",
    "Rule",
    "RuleFileError",
    "RuleIssue",
    "RuleSet",
    "load_rules",
    "parse_rules",
    "render_summary",
]

Op = Literal[">", ">=", "<", "<="]
OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}
RuleType = Literal["threshold", "forecast_breach", "residual", "drift", "fleet_underuse"]
GroupBy = Literal["none", "node", "rack", "cdu", "pdu", "fleet"]


class InhibitRule(BaseModel):
    """While the owning rule fires for entity X, alerts of ``rule`` on X or below X are muted."""

    model_config = ConfigDict(extra="forbid")

    rule: str
    along: Literal["cooling", "power"]
    hold_s: float = Field(
        default=0.0, ge=0, description="keep muting this long after the inhibiting alert clears"
    )


class Rule(BaseModel):
    """One alert rule; see the module docstring for the fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]*$", max_length=100)
    type: RuleType = "threshold"
    metric: str = Field(min_length=1)
    entity_kind: EntityKind | None = None
    op: Op | None = None
    value: float | None = None
    clear_value: float | None = None
    horizon_s: float | None = Field(default=None, gt=0)
    for_s: float = Field(default=0.0, ge=0)
    severity: Severity = "warning"
    group_by: GroupBy = "none"
    group_wait_s: float = Field(default=0.0, ge=0)
    resolve_if_absent_s: float | None = Field(default=None, gt=0)
    keep_firing_for_s: float = Field(
        default=0.0,
        ge=0,
        description="once firing, stay firing this long after the condition clears",
    )
    repeat_interval_s: float | None = Field(
        default=None, gt=0, description="re-send a firing incident's page this often"
    )
    recur_as_ticket_s: float | None = Field(
        default=None,
        gt=0,
        description="a state that recurs (a CDU near capacity at each daily peak): after an"
        " incident of this rule on a group was paged, a new one within this many s is sent as"
        " a ticket (severity info), at most one ticket per window; the rest are kept, not sent",
    )
    flap_changes: int | None = Field(
        default=None, ge=2, description="state changes within flap_window_s that mean flapping"
    )
    flap_window_s: float = Field(default=3600.0, gt=0)
    flap_stable_s: float | None = Field(
        default=None, gt=0, description="a flapping incident resolves after this long clear"
    )
    min_coverage_s: float | None = Field(
        default=None,
        gt=0,
        description="fleet_underuse: judge a fleet only once its figures cover this many"
        " seconds of data (the observation's covered_s label)",
    )
    min_excess_k: float | None = Field(
        default=None,
        ge=0,
        description="residual and R drift: fire only when the excess the value stands for is"
        " also at least this many K (residual default RESIDUAL_MIN_EXCESS_K, 3 K;"
        " docs/physics.md §2.7 and §2.6): k sigma alone pages a fraction of a kelvin where"
        " sigma is small, and an R drift at low heat is a kelvin of offset error",
    )
    runbook_url: str | None = Field(
        default=None,
        max_length=2000,
        pattern=r"^https?://",
        description="the rule's runbook, sent with every page (Alertmanager's runbook_url)",
    )
    summary: str = "{rule} on {entity_id}: {value:g}"
    labels: LabelSet = Field(default_factory=dict)
    inhibits: list[InhibitRule] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _type_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        kind = data.get("type", "threshold")
        if kind == "forecast_breach":
            data.setdefault("op", "<=")
            if "horizon_s" in data:
                data.setdefault("value", data["horizon_s"])
        elif kind == "residual":
            data.setdefault("min_excess_k", RESIDUAL_MIN_EXCESS_K)
        elif kind in ("drift", "fleet_underuse"):
            data.setdefault("op", ">")
            data.setdefault("value", 0.0)
            if kind == "fleet_underuse":
                data.setdefault("entity_kind", "fleet")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Rule:
        if self.type == "forecast_breach" and self.horizon_s is None:
            raise ValueError("horizon_s: required for type forecast_breach")
        if self.min_excess_k is not None and self.metric not in EXCESS_METRICS:
            raise ValueError(
                f"min_excess_k: only for a metric whose observations carry the excess in K"
                f" ({', '.join(sorted(EXCESS_METRICS))}), not {self.metric!r}"
            )
        if self.min_coverage_s is not None and self.type != "fleet_underuse":
            raise ValueError(
                "min_coverage_s: only for type fleet_underuse (its observations carry covered_s)"
            )
        if self.entity_kind is None:
            raise ValueError("entity_kind: required")
        if self.op is None:
            raise ValueError("op: required")
        if self.value is None:
            raise ValueError("value: required")
        if self.type == "forecast_breach" and self.op not in ("<", "<="):
            raise ValueError("op: a forecast_breach fires when time to breach is < or <=")
        if self.type == "residual" and self.op not in (">", ">="):
            raise ValueError("op: a residual rule fires above k sigma (> or >=)")
        if self.clear_value is not None:
            above = self.op in (">", ">=")
            if (above and self.clear_value > self.value) or (
                not above and self.clear_value < self.value
            ):
                side = "at or below" if above else "at or above"
                raise ValueError(
                    f"clear_value: must be {side} value {self.value:g} for op {self.op!r}"
                    f" (hysteresis), got {self.clear_value:g}"
                )
        try:
            render_summary(self.summary, _sample_context(self))
            quoted = summary_labels(self.summary)
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            raise ValueError(f"summary: bad template {self.summary!r}: {exc!r}") from None
        spec = METRICS.get(self.metric)
        unknown = sorted(quoted - set(spec.labels)) if spec is not None else []
        if unknown:
            carried = ", ".join(spec.labels) if spec and spec.labels else "none"
            raise ValueError(
                f"summary: quotes label(s) {', '.join(unknown)} that {self.metric} observations"
                f" do not always carry (they carry: {carried}); a page would show a value"
                " nobody reported"
            )
        return self

    # ---- evaluation helpers ---------------------------------------------------------------

    @property
    def threshold(self) -> float:
        assert self.value is not None
        return self.value

    @property
    def flap_hold_s(self) -> float:
        """How long a flapping incident must stay clear before it resolves."""
        return self.flap_window_s if self.flap_stable_s is None else self.flap_stable_s

    @property
    def clear_threshold(self) -> float:
        return self.threshold if self.clear_value is None else self.clear_value

    def breached(self, value: float, excess: float | None = None) -> bool:
        """The firing condition (a residual rule: k sigma and ``min_excess_k`` both)."""
        assert self.op is not None
        return OPS[self.op](value, self.threshold) and self._excess_ok(excess)

    def still_breached(self, value: float, excess: float | None = None) -> bool:
        """While firing: True until the value is past ``clear_value`` (a residual rule: or its
        excess under ``min_excess_k``)."""
        assert self.op is not None
        return OPS[self.op](value, self.clear_threshold) and self._excess_ok(excess)

    def _excess_ok(self, excess: float | None) -> bool:
        if self.min_excess_k is None:
            return True
        return excess is not None and math.isfinite(excess) and excess >= self.min_excess_k


class _AnyLabels(dict[str, str]):
    def __missing__(self, key: str) -> str:
        # never a bare "?": say which value is missing (the rule loader refuses a summary
        # quoting a label its metric does not always carry, so this is a detector's gap)
        return f"({key} not reported)"


def summary_labels(template: str) -> set[str]:
    """The label names a summary template quotes (``{labels[x]}``)."""
    out: set[str] = set()
    for _, field, _, _ in string.Formatter().parse(template):
        if field and field.startswith("labels["):
            out.add(field[len("labels[") :].split("]", 1)[0])
    return out


def _sample_context(rule: Rule) -> dict[str, Any]:
    return {
        "rule": rule.name,
        "entity_kind": rule.entity_kind or "gpu",
        "entity_id": "x",
        "value": 1.0,
        "threshold": rule.value if rule.value is not None else 0.0,
        "severity": rule.severity,
        "group_kind": "rack",
        "group_id": "x",
        "count": 1,
        "labels": {},
    }


def render_summary(template: str, context: Mapping[str, Any]) -> str:
    """``template.format_map(context)``; ``labels`` lookups of missing keys give ``?``."""
    ctx = dict(context)
    ctx["labels"] = _AnyLabels(ctx.get("labels") or {})
    return string.Formatter().vformat(template, (), ctx)


@dataclass(frozen=True)
class RuleSet:
    """Validated rules, by name, with an index by (metric, entity_kind)."""

    rules: tuple[Rule, ...] = ()
    source: str = "<rules>"

    def __post_init__(self) -> None:
        names = [r.name for r in self.rules]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate rule names in {names}")

    def __iter__(self) -> Iterator[Rule]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def by_name(self) -> dict[str, Rule]:
        return {r.name: r for r in self.rules}

    def index(self) -> dict[tuple[str, str], list[Rule]]:
        out: dict[tuple[str, str], list[Rule]] = {}
        for r in self.rules:
            assert r.entity_kind is not None
            out.setdefault((r.metric, r.entity_kind), []).append(r)
        return out


@dataclass(frozen=True)
class RuleIssue:
    """One problem: the rule (name or ``rules[i]``; empty for the file), the field, the text."""

    rule: str
    field: str
    message: str
    line: int | None = None


class RuleFileError(ValueError):
    """A rule file that cannot be read, parsed or validated; names file, rule and field."""

    def __init__(self, path: str, issues: list[RuleIssue]) -> None:
        self.path = path
        # every message through the log redaction: a file's text may hold a hook's secrets
        issues = [dataclasses.replace(i, message=redact_text(i.message)) for i in issues]
        self.issues = issues
        lines = []
        for i in issues:
            where = f"{path}:{i.line}" if i.line else path
            parts = [where]
            if i.rule:
                parts.append(f"rule {i.rule}")
            if i.field:
                parts.append(i.field)
            lines.append(": ".join([*parts, i.message]))
        super().__init__("\n".join(lines))


def _loc(loc: tuple[str | int, ...]) -> str:
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _rule_label(raw: Any, index: int) -> str:
    if isinstance(raw, dict) and isinstance(raw.get("name"), str):
        return f"{raw['name']!r} (rules[{index}])"
    return f"rules[{index}]"


def parse_rules(text: str, source: str = "<rules>") -> RuleSet:
    """Parse and validate rule-file text; raise :class:`RuleFileError` naming every problem.

    Keys other than ``rules`` are allowed at the top level only for ``hooks``, ``receivers``
    and ``route`` (see :mod:`twin.alerts.hooks`), so one file may hold both.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:  # said without quoting the file (it may hold hooks)
        register_config_secrets(text)
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        msg = f"invalid YAML: {parse_error_text(exc)}"
        raise RuleFileError(source, [RuleIssue("", "", msg, line)]) from None
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        raise RuleFileError(source, [RuleIssue("", "rules", "the file must hold `rules: [...]`")])
    extra = sorted(set(data) - {"rules", "hooks", "receivers", "route"})
    if extra:
        raise RuleFileError(
            source,
            [
                RuleIssue("", k, "unknown top-level key (rules, hooks, receivers, route)")
                for k in extra
            ],
        )
    issues: list[RuleIssue] = []
    rules: list[Rule] = []
    first: dict[str, int] = {}
    raws: list[Any] = data["rules"]
    for i, raw in enumerate(raws):
        label = _rule_label(raw, i)
        if not isinstance(raw, dict):
            issues.append(RuleIssue(label, "", "a rule must be a mapping"))
            continue
        try:
            rule = Rule.model_validate(raw)
        except ValidationError as exc:
            for err in exc.errors():
                field = _loc(err["loc"])
                msg = err["msg"]
                if msg.startswith("Value error, "):
                    msg = msg.removeprefix("Value error, ")
                    if not field and ": " in msg:
                        field, msg = msg.split(": ", 1)
                issues.append(RuleIssue(label, field, msg))
            continue
        problem = metric_problem(rule.metric, rule.entity_kind)
        if problem is not None:
            field = "metric" if problem.startswith("unknown metric") else "entity_kind"
            issues.append(RuleIssue(label, field, problem))
            continue
        if rule.name in first:
            issues.append(
                RuleIssue(
                    label, "name", f"duplicate rule name (first at rules[{first[rule.name]}])"
                )
            )
            continue
        first[rule.name] = i
        rules.append(rule)
    names = {r.name for r in rules} | {
        raw["name"] for raw in raws if isinstance(raw, dict) and isinstance(raw.get("name"), str)
    }
    for i, raw in enumerate(raws):
        if not isinstance(raw, dict) or not isinstance(raw.get("inhibits"), list):
            continue
        for j, inh in enumerate(raw["inhibits"]):
            target = inh.get("rule") if isinstance(inh, dict) else None
            if isinstance(target, str) and target == raw.get("name"):
                issues.append(
                    RuleIssue(
                        _rule_label(raw, i),
                        f"inhibits[{j}].rule",
                        "a rule cannot inhibit itself (it would mute its own pages)",
                    )
                )
            elif isinstance(target, str) and target not in names:
                issues.append(
                    RuleIssue(
                        _rule_label(raw, i),
                        f"inhibits[{j}].rule",
                        f"unknown rule {target!r}; the file has {sorted(names)}",
                    )
                )
    if issues:
        raise RuleFileError(source, issues)
    return RuleSet(tuple(rules), source)


def load_rules(path: str | Path) -> RuleSet:
    """Read and validate a rule file (see :func:`parse_rules`)."""
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RuleFileError(name, [RuleIssue("", "", f"cannot read rule file: {exc}")]) from None
    return parse_rules(text, name)
