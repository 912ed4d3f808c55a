"""Hooks: where notifications go. Generic JSON webhook, Slack, PagerDuty Events v2, Alertmanager.

Configured in YAML (the rule file or a file of its own)::

    hooks:
      - {type: webhook, name: ops-bus, url: "https://hooks.example/dctwin"}
      - {type: slack, url_env: DCTWIN_SLACK_WEBHOOK_URL}           # the URL is the secret
      - {type: pagerduty, routing_key_env: DCTWIN_PAGERDUTY_ROUTING_KEY}
      - {type: alertmanager, url: "http://alertmanager:9093", resend_interval_s: 60}

Routing (as Alertmanager's ``route``/``receivers``, one level deep)::

    receivers:
      - {name: oncall, hooks: [pagerduty, slack-facilities], pages: true}
      - {name: tickets, hooks: [ops-bus], pages: false}
    route:
      receiver: oncall                   # the default
      routes:
        - {match: {severity: info}, receiver: tickets}

The first route whose ``match`` holds (``severity``, ``rule``, ``group_kind``, ``group_id`` or a
rule label) picks the receiver; its hooks get the notification (:class:`Router`, used by the
outbox). A file where severity ``info`` can reach a receiver with ``pages: true`` is refused,
naming the route: info is a ticket and never pages. Without ``route`` every hook gets every
notification.

Every hook takes ``name`` (default ``<type>-<index>``; outbox rows are keyed by it, so keep it
stable), ``timeout_s`` (the **total** time one request may take, connect to last byte: a
receiver that trickles its answer is abandoned then, see :mod:`twin.alerts.deadline`) and
``headers`` (secret values). Secrets (``url``, ``routing_key``, header values) are
:class:`pydantic.SecretStr`: never logged, never stored in the outbox (rows hold the
notification; hooks render it when they send), never in an error text (URLs there are cut to
``scheme://host[:port]`` by :func:`twin.redact.redact_url`, secret values blanked).
``<field>_env`` reads a secret from the environment at load instead.

What each hook sends (``POST``, JSON):

**webhook** — :class:`WebhookEvent` (JSON schema: :func:`webhook_json_schema`)::

    {"version": 1, "event": "firing" | "resolved" | "acknowledge",
     "event_id": "<32 hex>", "dedup_key": "dctwin/<site>/<rule>/<group kind>/<group id>",
     "notification": {<Notification>} | null,      # null for acknowledge
     "acknowledged_at": "<RFC 3339>" | null}

A receiver dedupes on ``event_id`` (or on ``dedup_key`` + ``event``): delivery is at least
once. Any 2xx is success.

**slack** — an incoming-webhook message ``{"text": <fallback>, "blocks": [header, section,
context]}``; the context block carries the dedup key and event id. Slack answers 200 ``ok``.
Firing and resolved only.

**pagerduty** — Events API v2 (``https://events.pagerduty.com/v2/enqueue`` by default):
``{"routing_key", "event_action": "trigger" | "acknowledge" | "resolve", "dedup_key",
"payload": {"summary" (<= 1024 chars), "source", "severity", "timestamp", "component",
"group", "class", "custom_details"}, "client"}``; ``payload`` and ``client`` on trigger only.
A reminder (``repeat`` > 0) is a trigger with the same ``dedup_key``: PagerDuty adds it to the
open incident. ``custom_details`` carry ``repeat`` and ``flapping``. PagerDuty answers 202
``{"status": "success", "dedup_key": ...}``.

**alertmanager** — ``POST <url>/api/v2/alerts`` with a list of one postable alert:
``{"labels": {"alertname": <rule>, "severity", "site", "dedup_key", "group_kind", "group_id",
["racks",] <rule labels>}, "annotations": {"summary", "description", "members",
<observation context>}, "startsAt", "endsAt", "generatorURL"}``. Labels are strings and the
same for every event of an incident (observation labels, which may change, go to annotations),
so Alertmanager sees one alert (a reminder, ``repeat`` > 0, is that alert re-sent, with
``repeat`` and ``flapping`` annotations when set). Alertmanager resolves an alert whose
``endsAt`` has passed, so a firing alert is re-sent every ``resend_interval_s`` (as Prometheus
does) with ``endsAt`` four intervals ahead; its resolve carries the resolve time as
``endsAt``. Firing and resolved only (acknowledge there is a silence).

Outcome of a send (:class:`SendResult`): 2xx delivered; transport errors, 408, 425, 429 and
5xx are retried (``Retry-After`` honoured); any other status is a permanent failure.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import httpx
import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from twin.alerts.deadline import DeadlineTransport
from twin.alerts.model import EventKind, Notification, UtcDatetime, utc_iso
from twin.alerts.rules import RuleFileError, RuleIssue
from twin.redact import (
    parse_error_text,
    redact_text,
    redact_url,
    register_config_secrets,
    register_secret,
)

__all__ = [
    "AlertmanagerHook",
    "AlertmanagerHookConfig",
    "Hook",
    "HookConfig",
    "HookSetup",
    "PagerDutyHook",
    "PagerDutyHookConfig",
    "ReceiverConfig",
    "RouteConfig",
    "Router",
    "RoutingConfig",
    "SendResult",
    "SlackHook",
    "SlackHookConfig",
    "WebhookEvent",
    "WebhookHook",
    "WebhookHookConfig",
    "build_hook",
    "load_hook_setup",
    "load_hooks",
    "parse_hook_setup",
    "parse_hooks",
    "validate_hook_file",
    "webhook_json_schema",
]

PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
RETRYABLE = frozenset({408, 425, 429})


# ---- configuration -------------------------------------------------------------------------


class _HookConfigBase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    url: SecretStr | None = None
    url_env: str | None = Field(default=None, description="read url from this env variable")
    timeout_s: float = Field(
        default=5.0, gt=0, description="total deadline of one request (connect to last byte)"
    )
    headers: dict[str, SecretStr] = Field(default_factory=dict)

    def resolve_env(self, env: dict[str, str] | None = None) -> _HookConfigBase:
        """Fill ``<field>_env`` secrets from the environment; ValueError names the field."""
        env = dict(os.environ) if env is None else env
        update: dict[str, Any] = {}
        for fld in ("url", "routing_key"):
            var = getattr(self, f"{fld}_env", None)
            if var is None:
                continue
            if var not in env or not env[var]:
                raise ValueError(f"{fld}_env: environment variable {var} is not set")
            update[fld] = SecretStr(env[var])
        out = self.model_copy(update=update)
        if out.url is None:
            raise ValueError("url: required (or url_env)")
        try:  # never quote the URL: it is the secret
            parsed = httpx.URL(out.url.get_secret_value())
        except httpx.InvalidURL:
            raise ValueError("url: not a valid URL") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError("url: must be an http:// or https:// URL with a host")
        return out

    def secret_values(self) -> list[str]:
        """Every secret this hook holds (for redaction), the URL's path and query included."""
        out = [v.get_secret_value() for v in self.headers.values()]
        key = getattr(self, "routing_key", None)
        if key is not None:
            out.append(key.get_secret_value())
        if self.url is not None:
            url = self.url.get_secret_value()
            out.append(url)
            rest = url.removeprefix(redact_url(url))
            if len(rest.strip("/")) >= 8:  # a path long enough to be a token (Slack's is)
                out.append(rest)
        return [v for v in out if v]


class WebhookHookConfig(_HookConfigBase):
    type: Literal["webhook"]


class SlackHookConfig(_HookConfigBase):
    type: Literal["slack"]


class PagerDutyHookConfig(_HookConfigBase):
    type: Literal["pagerduty"]
    url: SecretStr | None = SecretStr(PAGERDUTY_EVENTS_URL)
    routing_key: SecretStr | None = None
    routing_key_env: str | None = None
    client: str = "dctwin"

    @model_validator(mode="after")
    def _key(self) -> PagerDutyHookConfig:
        if self.routing_key is None and self.routing_key_env is None:
            raise ValueError("routing_key: required (or routing_key_env)")
        return self


class AlertmanagerHookConfig(_HookConfigBase):
    type: Literal["alertmanager"]
    resend_interval_s: float | None = Field(
        default=60.0, gt=0, description="re-send firing alerts this often; null: never"
    )
    generator_url: str | None = None


HookConfig = Annotated[
    WebhookHookConfig | SlackHookConfig | PagerDutyHookConfig | AlertmanagerHookConfig,
    Field(discriminator="type"),
]


# ---- routing (severity -> receiver) -------------------------------------------------------

#: Notification fields a route may match on (the rule's labels are matched too).
ROUTE_FIELDS = ("severity", "rule", "group_kind", "group_id")


class ReceiverConfig(BaseModel):
    """A named set of hooks (Alertmanager's receiver: a set of integrations). ``pages``: it
    wakes someone (PagerDuty, an on-call channel); an ``info`` notification may never reach a
    receiver that pages."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    hooks: list[str] = Field(min_length=1, description="hook names")
    pages: bool = Field(description="it pages on-call (true) or files a ticket (false)")


class RouteConfig(BaseModel):
    """One route: notifications whose fields all equal ``match`` go to ``receiver``."""

    model_config = ConfigDict(extra="forbid")

    match: dict[str, str] = Field(min_length=1)
    receiver: str


class RoutingConfig(BaseModel):
    """Alertmanager's route tree, one level deep: the first route whose ``match`` holds picks
    the receiver; none: ``receiver`` (the default)."""

    model_config = ConfigDict(extra="forbid")

    receiver: str = Field(description="the default receiver")
    routes: list[RouteConfig] = Field(default_factory=list)


def _may_match_info(match: dict[str, str]) -> bool:
    return match.get("severity", "info") == "info"


class _HooksFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hooks: list[HookConfig] = Field(default_factory=list)
    receivers: list[ReceiverConfig] = Field(default_factory=list)
    route: RoutingConfig | None = None
    rules: Any = None

    @model_validator(mode="after")
    def _routing(self) -> _HooksFile:
        if self.route is None:
            if self.receivers:
                raise ValueError("route: required when receivers are given")
            return self
        hook_names = {c.name or f"{c.type}-{i}" for i, c in enumerate(self.hooks)}
        by_name: dict[str, ReceiverConfig] = {}
        for r in self.receivers:
            if r.name in by_name:
                raise ValueError(f"receivers: duplicate receiver name {r.name!r}")
            by_name[r.name] = r
            unknown = [h for h in r.hooks if h not in hook_names]
            if unknown:
                raise ValueError(
                    f"receivers: receiver {r.name!r} names no hook {', '.join(unknown)}"
                    f" (hooks: {', '.join(sorted(hook_names)) or 'none'})"
                )
        for where, name in [("route.receiver", self.route.receiver)] + [
            (f"route.routes[{i}].receiver", rt.receiver) for i, rt in enumerate(self.route.routes)
        ]:
            if name not in by_name:
                raise ValueError(f"{where}: no receiver {name!r}")
        # info never pages: every route an info notification can reach before one that takes
        # every info notification ({severity: info} alone) must lead to a ticket receiver
        for i, rt in enumerate(self.route.routes):
            if not _may_match_info(rt.match):
                continue
            if by_name[rt.receiver].pages:
                raise ValueError(
                    f"route.routes[{i}]: severity info can reach receiver {rt.receiver!r},"
                    " which pages (info is a ticket: route it to a receiver with pages: false)"
                )
            if rt.match == {"severity": "info"}:
                return self
        if by_name[self.route.receiver].pages:
            raise ValueError(
                f"route.receiver: severity info reaches the default receiver"
                f" {self.route.receiver!r}, which pages (add a first route"
                " {match: {severity: info}, receiver: <a receiver with pages: false>})"
            )
        return self


class Router:
    """Which hooks get a notification: the route's receiver's hooks; without a route, every
    hook (the behaviour before routing existed)."""

    def __init__(
        self, route: RoutingConfig | None = None, receivers: list[ReceiverConfig] | None = None
    ) -> None:
        self.route = route
        self.receivers = {r.name: r for r in receivers or []}

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Router)
            and self.route == other.route
            and self.receivers == other.receivers
        )

    def receiver_for(self, fields: dict[str, str]) -> ReceiverConfig | None:
        """The receiver a notification with these fields goes to (None: no routing)."""
        if self.route is None:
            return None
        for rt in self.route.routes:
            if all(fields.get(k) == v for k, v in rt.match.items()):
                return self.receivers[rt.receiver]
        return self.receivers[self.route.receiver]

    def hooks_for(self, note: Notification) -> set[str] | None:
        """Hook names that get ``note``; None: every hook."""
        fields = {
            **note.labels,
            "severity": note.severity,
            "rule": note.rule,
            "group_kind": note.group.kind,
            "group_id": note.group.id,
        }
        rec = self.receiver_for(fields)
        return None if rec is None else set(rec.hooks)

    def describe(self) -> list[dict[str, Any]]:
        """Per severity, where a notification with no other labels goes (for ``rules check``)."""
        out = []
        for sev in ("critical", "warning", "info"):
            rec = self.receiver_for({"severity": sev})
            out.append(
                {
                    "severity": sev,
                    "receiver": rec.name if rec else "(every hook: no route)",
                    "hooks": sorted(rec.hooks) if rec else None,
                    "pages": rec.pages if rec else None,
                }
            )
        return out


@dataclass(frozen=True)
class HookSetup:
    """A hook file's hooks and its router."""

    hooks: list[Hook]
    router: Router


# ---- payloads ------------------------------------------------------------------------------


class WebhookEvent(BaseModel):
    """The body of the generic webhook (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    event: EventKind
    event_id: str
    dedup_key: str
    notification: Notification | None = None
    acknowledged_at: UtcDatetime | None = None


def webhook_json_schema() -> dict[str, Any]:
    """JSON schema of the generic webhook's body."""
    return WebhookEvent.model_json_schema()


@dataclass(frozen=True)
class OutboxEvent:
    """What one outbox row asks a hook to send."""

    event: EventKind
    dedup_key: str
    event_id: str
    notification: Notification | None  # None for acknowledge
    at: datetime  # when it was enqueued


@dataclass(frozen=True)
class SendResult:
    """Outcome of one HTTP delivery attempt."""

    ok: bool
    retry: bool
    status_code: int | None = None
    error: str | None = None
    retry_after_s: float | None = None


def _retry_after(resp: httpx.Response, now: datetime) -> float | None:
    raw = resp.headers.get("Retry-After")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        return max(0.0, (parsedate_to_datetime(raw) - now).total_seconds())
    except (TypeError, ValueError):
        return None


# ---- hooks ---------------------------------------------------------------------------------


class Hook(ABC):
    """One configured destination. ``render`` builds (url, JSON body); ``send`` posts it."""

    events: ClassVar[frozenset[str]] = frozenset({"firing", "resolved"})

    def __init__(self, config: _HookConfigBase, name: str, client: httpx.Client | None = None):
        self.config = config
        self.name = name
        self._secrets = config.secret_values()
        for value in self._secrets:
            register_secret(value)  # blanked in every log line of the process
        self._transport: DeadlineTransport | None = None
        if client is None:
            self._transport = DeadlineTransport()
            client = httpx.Client(timeout=config.timeout_s, transport=self._transport)
        self._client = client

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {self.target}>"

    @property
    def target(self) -> str:
        """Where it sends, without the secret: ``scheme://host[:port]``."""
        return redact_url(self._url()) if self.config.url is not None else "<no url>"

    def same_as(self, other: Hook) -> bool:
        """The same destination and settings (a reload keeps such a hook running)."""
        return type(self) is type(other) and self.name == other.name and self.config == other.config

    def redact(self, text: str) -> str:
        """``text`` without this hook's secrets and with every URL cut to its host."""
        return redact_text(text, self._secrets)

    @property
    def resend_interval_s(self) -> float | None:
        return None

    def supports(self, event: str) -> bool:
        return event in self.events

    def _url(self) -> str:
        assert self.config.url is not None
        return self.config.url.get_secret_value()

    @abstractmethod
    def render(self, ev: OutboxEvent, now: datetime) -> tuple[str, Any]:
        """The URL and JSON body for one event."""

    def _accepted(self, resp: httpx.Response) -> bool:
        return 200 <= resp.status_code < 300

    def send(self, ev: OutboxEvent, now: datetime) -> SendResult:
        """One POST, abandoned at ``timeout_s`` in total; every error text is redacted."""
        url, body = self.render(ev, now)
        headers = {k: v.get_secret_value() for k, v in self.config.headers.items()}
        timeout_s = self.config.timeout_s
        started = time.monotonic()
        try:
            if self._transport is not None:
                with self._transport.deadline(timeout_s):
                    resp = self._client.post(url, json=body, headers=headers)
            else:
                resp = self._client.post(url, json=body, headers=headers)
        except httpx.TimeoutException as exc:
            took = time.monotonic() - started
            msg = (
                f"{type(exc).__name__}: no complete answer within {timeout_s:g} s"
                f" (abandoned after {took:.1f} s)"
            )
            return SendResult(False, True, None, self.redact(msg))
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            return SendResult(False, True, None, self.redact(f"{type(exc).__name__}: {exc}"))
        code = resp.status_code
        if self._accepted(resp):
            return SendResult(True, False, code)
        detail = self.redact(f"HTTP {code}: {resp.text[:300]}")
        if code in RETRYABLE or code >= 500:
            return SendResult(False, True, code, detail, _retry_after(resp, now))
        return SendResult(False, False, code, detail)

    def close(self) -> None:
        self._client.close()


class WebhookHook(Hook):
    events = frozenset({"firing", "resolved", "acknowledge"})

    def render(self, ev: OutboxEvent, now: datetime) -> tuple[str, Any]:
        body = WebhookEvent(
            event=ev.event,
            event_id=ev.event_id,
            dedup_key=ev.dedup_key,
            notification=ev.notification,
            acknowledged_at=ev.at if ev.event == "acknowledge" else None,
        )
        return self._url(), body.model_dump(mode="json")


_SLACK_ICON = {
    "critical": ":red_circle:",
    "warning": ":large_orange_circle:",
    "info": ":information_source:",
}


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _status_word(n: Notification) -> str:
    """``FIRING``, ``FIRING, REMINDER 2``, ``RESOLVED, FLAPPING`` ..."""
    word = n.status.upper()
    if n.repeat:
        word += f", REMINDER {n.repeat}"
    if n.flapping:
        word += ", FLAPPING"
    return word


class SlackHook(Hook):
    def render(self, ev: OutboxEvent, now: datetime) -> tuple[str, Any]:
        n = ev.notification
        assert n is not None
        icon = ":white_check_mark:" if n.status == "resolved" else _SLACK_ICON[n.severity]
        head = f"[{_status_word(n)}] [{n.severity}] {n.summary}"
        links = " · ".join(
            f"<{url}|{text}>"
            for url, text in ((n.url, "console"), (n.runbook_url, "runbook"))
            if url
        )
        context = (
            f"site `{n.site}` · rule `{n.rule}` · since {utc_iso(n.starts_at)}"
            + (f" · resolved {utc_iso(n.ends_at)}" if n.ends_at else "")
            + (f" · values in {n.unit}" if n.unit else "")
            + f" · dedup_key `{n.dedup_key}` · event `{ev.event_id}`"
            + (f" · {links}" if links else "")
        )
        body = {
            "text": _clip(f"{icon} {head}", 3000),
            "blocks": [
                {"type": "header", "text": {"type": "plain_text", "text": _clip(head, 150)}},
                {"type": "section", "text": {"type": "mrkdwn", "text": _clip(n.description, 3000)}},
                {"type": "context", "elements": [{"type": "mrkdwn", "text": _clip(context, 3000)}]},
            ],
        }
        return self._url(), body

    def _accepted(self, resp: httpx.Response) -> bool:
        return resp.status_code == 200


class PagerDutyHook(Hook):
    events = frozenset({"firing", "resolved", "acknowledge"})
    ACTIONS: ClassVar[dict[str, str]] = {
        "firing": "trigger",
        "resolved": "resolve",
        "acknowledge": "acknowledge",
    }

    def render(self, ev: OutboxEvent, now: datetime) -> tuple[str, Any]:
        cfg = self.config
        assert isinstance(cfg, PagerDutyHookConfig) and cfg.routing_key is not None
        body: dict[str, Any] = {
            "routing_key": cfg.routing_key.get_secret_value(),
            "event_action": self.ACTIONS[ev.event],
            "dedup_key": ev.dedup_key,
        }
        n = ev.notification
        if ev.event == "firing" and n is not None:
            body["payload"] = {
                "summary": _clip(n.summary, 1024),
                "source": f"{n.site}/{n.group.kind}/{n.group.id}",
                "severity": n.severity,
                "timestamp": utc_iso(n.starts_at),
                "component": n.group.id,
                "group": n.group.kind,
                "class": n.rule,
                "custom_details": {
                    "description": n.description,
                    "members": {m.entity_id: m.value for m in n.members},
                    "unit": n.unit,
                    "runbook_url": n.runbook_url,
                    "labels": n.labels,
                    "event_id": ev.event_id,
                    "repeat": n.repeat,
                    "flapping": n.flapping,
                },
            }
            body["client"] = cfg.client
            if n.url:
                body["client_url"] = n.url
            links = [
                {"href": u, "text": t}
                for u, t in ((n.url, "console"), (n.runbook_url, "runbook"))
                if u
            ]
            if links:
                body["links"] = links
        return self._url(), body

    def _accepted(self, resp: httpx.Response) -> bool:
        if not 200 <= resp.status_code < 300:
            return False
        try:
            return resp.json().get("status") == "success"
        except ValueError:
            return True  # accepted by status code; body is informative only


class AlertmanagerHook(Hook):
    @property
    def resend_interval_s(self) -> float | None:
        assert isinstance(self.config, AlertmanagerHookConfig)
        return self.config.resend_interval_s

    def render(self, ev: OutboxEvent, now: datetime) -> tuple[str, Any]:
        cfg = self.config
        assert isinstance(cfg, AlertmanagerHookConfig)
        n = ev.notification
        assert n is not None
        labels = {
            **n.labels,
            "alertname": n.rule,
            "severity": n.severity,
            "site": n.site,
            "dedup_key": n.dedup_key,
        }
        annotations = {
            "summary": n.summary,
            "description": n.description,
            "members": ", ".join(
                f"{m.entity_id}={m.value:g}{' ' + n.unit if n.unit else ''}" for m in n.members
            ),
            **{k: v for k, v in n.context.items() if k not in ("summary", "description")},
        }
        if n.unit:
            annotations["unit"] = n.unit
        if n.runbook_url:
            annotations["runbook_url"] = n.runbook_url
        if n.repeat:  # annotations may change between re-sends; labels may not
            annotations["repeat"] = str(n.repeat)
        if n.flapping:
            annotations["flapping"] = "true"
        alert: dict[str, Any] = {
            "labels": labels,
            "annotations": annotations,
            "startsAt": utc_iso(n.starts_at),
        }
        if n.status == "resolved":
            alert["endsAt"] = utc_iso(n.ends_at or now)
        elif cfg.resend_interval_s is not None:
            alert["endsAt"] = utc_iso(now + timedelta(seconds=4 * cfg.resend_interval_s))
        if n.url or cfg.generator_url:  # the component's console page first
            alert["generatorURL"] = n.url or cfg.generator_url
        return self._url().rstrip("/") + "/api/v2/alerts", [alert]


_HOOK_TYPES: dict[str, type[Hook]] = {
    "webhook": WebhookHook,
    "slack": SlackHook,
    "pagerduty": PagerDutyHook,
    "alertmanager": AlertmanagerHook,
}


def build_hook(config: _HookConfigBase, index: int = 0, client: httpx.Client | None = None) -> Hook:
    """A :class:`Hook` from a (secret-resolved) config."""
    kind = config.type  # type: ignore[attr-defined]
    return _HOOK_TYPES[kind](config, config.name or f"{kind}-{index}", client)


def _validate(data: Any, source: str) -> _HooksFile:
    """The hook file's structure, receivers and route validated (secrets not resolved)."""
    try:
        parsed = _HooksFile.model_validate(data if isinstance(data, dict) else {"hooks": data})
    except ValidationError as exc:
        issues = []
        for err in exc.errors():
            loc = list(err["loc"])
            where = ""
            if len(loc) >= 2 and loc[0] == "hooks" and isinstance(loc[1], int):
                where = f"hooks[{loc[1]}]"
                loc = loc[2:]
                if loc and isinstance(loc[0], str) and loc[0] in _HOOK_TYPES:
                    loc = loc[1:]  # the discriminator's tag
            field = ".".join(str(p) for p in loc)
            msg = err["msg"].removeprefix("Value error, ")
            if not field and ": " in msg:
                field, msg = msg.split(": ", 1)
            issues.append(RuleIssue(where, field, msg))
        raise RuleFileError(source, issues) from None
    return parsed


def validate_hook_file(path: str | Path) -> Router:
    """Validate a hook file's hooks, receivers and route without reading the environment's
    secrets (``dctwin rules check --hooks``); its router. :class:`RuleFileError` names the
    hook, receiver or route."""
    name = str(path)
    data = _read_yaml(path, name)
    parsed = _validate(data or {}, name)
    names: set[str] = set()
    for i, cfg in enumerate(parsed.hooks):
        name_i = cfg.name or f"{cfg.type}-{i}"  # type: ignore[attr-defined]
        if name_i in names:
            raise RuleFileError(name, [RuleIssue(f"hooks[{i}]", "name", "duplicate hook name")])
        names.add(name_i)
    return Router(parsed.route, parsed.receivers)


def parse_hooks(
    data: Any, source: str = "<hooks>", env: dict[str, str] | None = None
) -> list[Hook]:
    """Hooks from parsed YAML (``{"hooks": [...]}``); :class:`RuleFileError` names the hook."""
    return parse_hook_setup(data, source, env).hooks


def parse_hook_setup(
    data: Any, source: str = "<hooks>", env: dict[str, str] | None = None
) -> HookSetup:
    """Hooks and their router (``receivers:``, ``route:``) from parsed YAML;
    :class:`RuleFileError` names the hook, receiver or route."""
    parsed = _validate(data, source)
    resolved: list[_HookConfigBase] = []
    names: set[str] = set()
    problems: list[RuleIssue] = []
    for i, cfg in enumerate(parsed.hooks):
        try:
            resolved.append(cfg.resolve_env(env))
        except ValueError as exc:
            field, _, msg = str(exc).partition(": ")
            problems.append(RuleIssue(f"hooks[{i}]", field, msg))
        name = cfg.name or f"{cfg.type}-{i}"  # type: ignore[attr-defined]
        if name in names:
            problems.append(RuleIssue(f"hooks[{i}]", "name", "duplicate hook name"))
        names.add(name)
    if problems:
        raise RuleFileError(source, problems)
    hooks = [build_hook(cfg, i) for i, cfg in enumerate(resolved)]
    return HookSetup(hooks, Router(parsed.route, parsed.receivers))


def load_hooks(path: str | Path, env: dict[str, str] | None = None) -> list[Hook]:
    """Hooks from a YAML file's ``hooks:`` list (a rule file may hold it too)."""
    return load_hook_setup(path, env).hooks


def load_hook_setup(path: str | Path, env: dict[str, str] | None = None) -> HookSetup:
    """Hooks and their router from a YAML file (``hooks:``, ``receivers:``, ``route:``)."""
    name = str(path)
    data = _read_yaml(path, name)
    return parse_hook_setup(data or {}, name, env)


def _read_yaml(path: str | Path, name: str) -> Any:
    """A hook file's YAML (or JSON); :class:`RuleFileError` when it cannot be read or parsed,
    saying where without quoting the file (:func:`twin.redact.parse_error_text`: a line
    with a routing key or a URL path must not reach a log), its secret-looking values
    registered for redaction first."""
    text = ""
    try:
        text = Path(path).read_text(encoding="utf-8")
        return yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        register_config_secrets(text)
        msg = f"cannot read hooks: {parse_error_text(exc)}"
        raise RuleFileError(name, [RuleIssue("", "", msg)]) from None
