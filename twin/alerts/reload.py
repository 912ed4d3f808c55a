"""Reload the rule and hook files of a running service, as Prometheus and Alertmanager do on
SIGHUP: both files are read and validated first; if either is bad, one error is logged and the
running rules and hooks stay; if both are good, they are swapped in (the workers of changed
hooks restart, pending outbox rows of hooks that still exist keep going) and one line is
logged::

    reloader = AlertReloader(engine, delivery, Path("rules.yaml"), Path("hooks.yaml"))
    signal.signal(signal.SIGHUP, reloader.on_signal)   # reloads in a thread of its own
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twin.alerts.hooks import Hook, Router, load_hook_setup
from twin.alerts.rules import RuleFileError, load_rules

if TYPE_CHECKING:
    from twin.alerts.engine import AlertEngine
    from twin.alerts.outbox import Delivery

__all__ = ["AlertReloader"]

log = logging.getLogger(__name__)


@dataclass
class AlertReloader:
    """Reloads ``rules`` (and ``hooks``, when given) into ``engine`` and ``delivery``."""

    engine: AlertEngine
    delivery: Delivery
    rules: Path
    hooks: Path | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def reload(self) -> bool:
        """Validate both files, then swap them in; False (and one error logged) if either is
        bad, with nothing changed. One reload at a time."""
        with self._lock:
            new_hooks: list[Hook] = []
            router: Router | None = None
            try:
                new_rules = load_rules(self.rules)
                if self.hooks is not None:
                    setup = load_hook_setup(self.hooks)
                    new_hooks, router = setup.hooks, setup.router
            except RuleFileError as exc:
                what = "; ".join(str(exc).splitlines())
                log.error("reload refused, keeping the running rules and hooks: %s", what)
                return False
            self.engine.reload(new_rules)
            if self.hooks is None:
                log.info("reloaded %d alert rules from %s", len(new_rules), self.rules)
                return True
            change = self.delivery.reload(new_hooks, router=router)
            parts = [f"{k} {', '.join(v)}" for k, v in change.items() if v and k != "kept"]
            log.info(
                "reloaded %d alert rules from %s and %d hooks from %s (%s)",
                len(new_rules),
                self.rules,
                len(new_hooks),
                self.hooks,
                "; ".join(parts) or "hooks unchanged",
            )
            return True

    def on_signal(self, signum: int, frame: Any) -> None:
        """A signal handler: reload in a daemon thread (the main loop is not held)."""
        threading.Thread(target=self._reload_logged, name="alert-reload", daemon=True).start()

    def _reload_logged(self) -> None:
        try:
            self.reload()
        except Exception:  # a reload must never take the service down
            log.exception("reload failed; the running rules and hooks stay")
