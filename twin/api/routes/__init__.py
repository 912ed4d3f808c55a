"""The API's routers, one per module and group of endpoints: each owns its prefix and its
OpenAPI tag (``router = APIRouter(prefix=..., tags=[...])``); :func:`twin.api.app.create_app`
mounts them in this order. Each endpoint takes the app's :class:`twin.api.deps.ApiState` by
dependency."""

from twin.api.routes import alerts, analysis, components, probes, service, site, telemetry

ROUTERS = [
    probes.router,
    service.router,
    site.router,
    telemetry.router,
    components.router,
    analysis.router,
    alerts.router,
]

__all__ = ["ROUTERS"]
