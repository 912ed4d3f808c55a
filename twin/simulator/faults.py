"""Faults the simulator can inject, and the CLI syntax that names them.

Syntax: ``KIND:TARGET@START[+DURATION][=MAGNITUDE]``

- ``KIND``: one of :data:`FAULT_KINDS`.
- ``TARGET``: what fails: a GPU id ``<node>:<index>`` (cold_plate, cold_plate_decay),
  ``<cdu>/<pump>`` (pump_failure), ``<pdu>/L<n>`` (phase_overload, phase_creep), a fleet name
  (fleet_idle).
  A GPU id holds a ``:`` itself, so the kind ends at the *first* ``:`` and the target at the
  *last* ``@``.
- ``START`` and ``DURATION``: seconds after the simulation start, as ``600``, ``600s``,
  ``10m``, ``1.5h`` or ``1d``. Without ``+DURATION`` the fault lasts to the end.
- ``=MAGNITUDE`` (optional): a number overriding the kind's default (see :class:`Fault`).

Examples: ``cold_plate:trn-a01-n1:3@10m``, ``pump_failure:cdu-1/pump1@20m+15m``,
``phase_overload:pdu-a01-a/L1@30m``, ``fleet_idle:infer-chat@1h``.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from collectors.base import parse_duration_s

__all__ = [
    "FAULT_KINDS",
    "RAMPED_KINDS",
    "RAMP_DEFAULT_S",
    "Fault",
    "parse_duration_s",
    "parse_fault",
]

FaultKind = Literal[
    "cold_plate", "cold_plate_decay", "pump_failure", "phase_overload", "phase_creep", "fleet_idle"
]
FAULT_KINDS: tuple[str, ...] = (
    "cold_plate",
    "cold_plate_decay",
    "pump_failure",
    "phase_overload",
    "phase_creep",
    "fleet_idle",
)
#: Faults whose magnitude ramps up linearly over +DURATION (default RAMP_DEFAULT_S) and stays.
RAMPED_KINDS = frozenset({"phase_creep", "cold_plate_decay"})
#: ramp length of a ramped fault given without +DURATION [s]
RAMP_DEFAULT_S = 3600.0


class Fault(BaseModel):
    """One injected fault, active over ``[start_s, start_s + duration_s)`` of simulated time.

    ``magnitude`` by kind (None takes the default):

    - ``cold_plate``: the GPU's thermal resistance is multiplied by ``1 + magnitude`` [1];
      default: the GPU's R rises by +0.1 K/W (degraded TIM, docs/physics.md §9.2).
    - ``cold_plate_decay``: as ``cold_plate``, but R degrades linearly from its healthy value
      at ``start_s`` to the full magnitude over ``duration_s`` (default 1 h) and stays there:
      thermal paste pumping out, a cold plate fouling. The fault never ends.
    - ``pump_failure``: unused; the pump stops.
    - ``phase_overload``: extra real load on that phase [W]; default: enough to take the phase
      current to 95 % of the PDU's per-phase rating when the fault starts.
    - ``phase_creep``: like ``phase_overload``, but the extra load grows linearly from zero
      at ``start_s`` to ``magnitude`` over ``duration_s`` (default 1 h) and then stays: load
      creeping onto one phase (servers added, outlets rebalanced), which a forecast can see
      coming. The fault never ends; its duration is the ramp.
    - ``fleet_idle``: the fleet's SM activity while idle [1]; default 0.03.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: FaultKind
    target: str = Field(min_length=1)
    start_s: float = Field(ge=0, description="seconds after the simulation start [s]")
    duration_s: float | None = Field(
        default=None, gt=0, description="length [s]; None lasts to the end of the simulation"
    )
    magnitude: float | None = None

    @field_validator("start_s", "duration_s", "magnitude")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    def active(self, elapsed_s: float) -> bool:
        """True when the fault is active ``elapsed_s`` seconds after the start."""
        if elapsed_s < self.start_s:
            return False
        if self.kind in RAMPED_KINDS:
            return True
        return self.duration_s is None or elapsed_s < self.start_s + self.duration_s

    def ramp_fraction(self, elapsed_s: float) -> float:
        """How much of a ramped fault's magnitude applies at ``elapsed_s`` (1 for the others)."""
        if self.kind not in RAMPED_KINDS:
            return 1.0
        ramp_s = self.duration_s or RAMP_DEFAULT_S
        return min(1.0, max(0.0, (elapsed_s - self.start_s) / ramp_s))

    def __str__(self) -> str:
        out = f"{self.kind}:{self.target}@{_fmt(self.start_s)}"
        if self.duration_s is not None:
            out += f"+{_fmt(self.duration_s)}"
        if self.magnitude is not None:
            out += f"={self.magnitude!r}"
        return out


def _fmt(seconds: float) -> str:
    return f"{seconds:.6f}".rstrip("0").rstrip(".") + "s"


def parse_fault(spec: str) -> Fault:
    """Parse ``KIND:TARGET@START[+DURATION][=MAGNITUDE]`` into a :class:`Fault`.

    Raises ValueError naming the part that is wrong. Targets are checked against the site by
    the simulator, not here.

    >>> parse_fault("cold_plate:trn-a01-n1:3@10m")
    Fault(kind='cold_plate', target='trn-a01-n1:3', start_s=600.0, duration_s=None, magnitude=None)
    >>> parse_fault("pump_failure:cdu-1/pump1@20m+15m").duration_s
    900.0
    """
    text = spec.strip()
    usage = "expected KIND:TARGET@START[+DURATION][=MAGNITUDE], e.g. pump_failure:cdu-1/pump1@20m"
    kind, sep, rest = text.partition(":")
    if not sep:
        raise ValueError(f"fault {spec!r} has no ':' after the kind; {usage}")
    kind = kind.strip()
    if kind not in FAULT_KINDS:
        raise ValueError(f"fault {spec!r}: unknown kind {kind!r}; expected one of {FAULT_KINDS}")
    target, sep, when = rest.rpartition("@")
    if not sep:
        raise ValueError(f"fault {spec!r} has no '@START'; {usage}")
    target = target.strip()
    if not target:
        raise ValueError(f"fault {spec!r} has an empty target; {usage}")
    magnitude: float | None = None
    if "=" in when:
        when, mag_text = when.split("=", 1)
        try:
            magnitude = float(mag_text)
        except ValueError:
            raise ValueError(f"fault {spec!r}: magnitude {mag_text!r} is not a number") from None
        if not math.isfinite(magnitude):
            raise ValueError(f"fault {spec!r}: magnitude {mag_text!r} is not finite")
    start_text, plus, dur_text = when.partition("+")
    start_s = parse_duration_s(start_text, f"fault {spec!r}: start")
    duration_s: float | None = None
    if plus:
        duration_s = parse_duration_s(dur_text, f"fault {spec!r}: duration")
        if duration_s <= 0:
            raise ValueError(f"fault {spec!r}: duration must be positive")
    return Fault(
        kind=kind,  # type: ignore[arg-type]
        target=target,
        start_s=start_s,
        duration_s=duration_s,
        magnitude=magnitude,
    )
