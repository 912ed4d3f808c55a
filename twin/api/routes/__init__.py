"""The API's routers, one per group of endpoints; :func:`twin.api.app.create_app` mounts them
in this order. Each endpoint takes the app's :class:`twin.api.deps.ApiState` by dependency."""

from twin.api.routes import alerts, analysis, components, service, telemetry

ROUTERS = [
    service.router,
    telemetry.router,
    components.router,
    analysis.router,
    alerts.router,
]

__all__ = ["ROUTERS"]
