"""Alerting: YAML rules evaluated on observations, grouped along the power and cooling trees,
inhibited and silenced, delivered through a durable outbox to webhooks, Slack, PagerDuty and
Alertmanager.

Typical wiring in the service::

    db = AlertDb(store)                       # the store's connection; creates alert tables
    outbox = Outbox(db, load_hooks("deploy/alert_hooks.yaml"))
    engine = AlertEngine(load_rules("deploy/alert_rules.yaml"), Topology.from_site(site), outbox)
    Delivery(outbox).start()
    ...
    engine.evaluate(observations)             # each evaluation: list[Observation]
"""

from twin.alerts.db import AlertDb, ensure_alert_tables
from twin.alerts.engine import AlertEngine, Silences, dedup_key
from twin.alerts.hooks import (
    AlertmanagerHook,
    Hook,
    PagerDutyHook,
    SendResult,
    SlackHook,
    WebhookEvent,
    WebhookHook,
    build_hook,
    load_hooks,
    parse_hooks,
    webhook_json_schema,
)
from twin.alerts.model import GroupRef, Member, Notification, Observation, Silence
from twin.alerts.outbox import Delivery, DeliveryReport, Outbox
from twin.alerts.rules import Rule, RuleFileError, RuleSet, load_rules, parse_rules
from twin.alerts.topology import Topology

__all__ = [
    "AlertDb",
    "AlertEngine",
    "AlertmanagerHook",
    "Delivery",
    "DeliveryReport",
    "GroupRef",
    "Hook",
    "Member",
    "Notification",
    "Observation",
    "Outbox",
    "PagerDutyHook",
    "Rule",
    "RuleFileError",
    "RuleSet",
    "SendResult",
    "Silence",
    "Silences",
    "SlackHook",
    "Topology",
    "WebhookEvent",
    "WebhookHook",
    "build_hook",
    "dedup_key",
    "ensure_alert_tables",
    "load_hooks",
    "load_rules",
    "parse_hooks",
    "parse_rules",
    "webhook_json_schema",
]
