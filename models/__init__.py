"""The physics of dctwin: pure, vectorized numpy/scipy functions. No I/O, no DuckDB, no MQTT.

One module per domain (pvlib style), plain functions taking and returning arrays, every
parameter's unit in brackets in its docstring, the equation in Notes and the source in
References (sections of ``reference/physics.md``):

- :mod:`models.gpu_power`: GPU board power from SM activity.
- :mod:`models.gpu_thermal`: first-order RC temperature above the local coolant or air.
- :mod:`models.coolant`: water/PG25 properties and the loop heat balance.
- :mod:`models.cdu`: parallel pumps on a system curve, pump power, supply temperature.
- :mod:`models.electrical`: node power, PSU losses, PDU phase and delta line currents.
- :mod:`models.network`: all-reduce traffic and link utilization.
"""

from models import cdu, coolant, electrical, gpu_power, gpu_thermal, network

__all__ = ["cdu", "coolant", "electrical", "gpu_power", "gpu_thermal", "network"]
