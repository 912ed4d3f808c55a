"""The HTTP API of `dctwin serve`: FastAPI on uvicorn, in a thread of the service process.

``ApiServer(ApiContext(store, site=..., ingester=..., engine=..., token=...)).start()``
(:class:`twin.service.Service` does this for `dctwin serve`); the app is assembled in
:mod:`twin.api.app`, the endpoints are routers in :mod:`twin.api.routes` taking their state by
dependency (:mod:`twin.api.deps`), the response models are in :mod:`twin.api.models`, the
Prometheus metrics in :mod:`twin.api.metrics`.
"""

from twin.api.app import ARROW_STREAM, create_app
from twin.api.context import ApiContext
from twin.api.server import DEFAULT_HOST, DEFAULT_PORT, ApiError, ApiServer

__all__ = [
    "ARROW_STREAM",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "ApiContext",
    "ApiError",
    "ApiServer",
    "create_app",
]
