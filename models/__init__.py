"""The physics of dctwin: pure, vectorized numpy/scipy functions. No I/O, no DuckDB, no MQTT.

One module per domain (pvlib style), plain functions taking and returning arrays, every
parameter's unit in brackets in its docstring, the equation in Notes and the source in
References (sections of ``docs/physics.md``):

- :mod:`models.gpu_power`: GPU board power from SM activity.
- :mod:`models.gpu_thermal`: first-order RC temperature above the local coolant or air.
- :mod:`models.coolant`: water/PG25 properties and the loop heat balance.
- :mod:`models.cdu`: parallel pumps on a system curve, pump power, supply temperature.
- :mod:`models.electrical`: node power, PSU losses, PDU phase and delta line currents.
- :mod:`models.network`: all-reduce traffic and link utilization.
- :mod:`models.fit_quality`: MAE, CV(RMSE), NMBE, MAPE and the data checks every fitter uses.

Each domain module also holds its fitter (``fit_power_curve``, ``fit_rc``, ``fit_rack_power``,
``fit_capture_fraction``): vectorized over devices, returning per-device parameters with their
standard errors, and ``usable``/``reason`` where the data cannot identify them.
"""

from models import cdu, coolant, electrical, fit_quality, gpu_power, gpu_thermal, network

__all__ = ["cdu", "coolant", "electrical", "fit_quality", "gpu_power", "gpu_thermal", "network"]
