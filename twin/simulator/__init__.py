"""A physics-consistent simulator of a whole site, publishing contract messages.

``SiteSimulator(site, seed=..., start=..., rate_hz=..., faults=[...]).step()`` returns one
tick's (topic, payload) pairs; the MQTT loop and the CLI live elsewhere. See README.md.
"""

from twin.simulator.engine import SiteSimulator
from twin.simulator.faults import FAULT_KINDS, Fault, parse_duration_s, parse_fault

__all__ = ["FAULT_KINDS", "Fault", "SiteSimulator", "parse_duration_s", "parse_fault"]
