"""Load forecasts per fleet and per rack (p05/p50/p90/p95) and their backtest."""

from twin.forecast.forecast import (
    BacktestReport,
    EntityForecast,
    ForecastCache,
    SiteForecast,
    forecast_site,
    rack_ratio_paths,
    run_backtest,
)
from twin.forecast.series import PowerSeries, load_power_series

__all__ = [
    "BacktestReport",
    "EntityForecast",
    "ForecastCache",
    "PowerSeries",
    "SiteForecast",
    "forecast_site",
    "load_power_series",
    "rack_ratio_paths",
    "run_backtest",
]
