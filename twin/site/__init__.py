"""The site model (pydantic) and hardware catalog; ``load_site`` reads a site YAML file."""

from twin.site.catalog import CDU_MODELS, GPU_MODELS, NODE_MODELS, CduModel, GpuModel, NodeModel
from twin.site.loader import SiteError, SiteIssue, load_site
from twin.site.model import (
    Breaker,
    Cdu,
    Fleet,
    Hall,
    Link,
    Node,
    Pdu,
    Rack,
    Row,
    Shard,
    Site,
    Switch,
)

__all__ = [
    "CDU_MODELS",
    "GPU_MODELS",
    "NODE_MODELS",
    "Breaker",
    "Cdu",
    "CduModel",
    "Fleet",
    "GpuModel",
    "Hall",
    "Link",
    "Node",
    "NodeModel",
    "Pdu",
    "Rack",
    "Row",
    "Shard",
    "Site",
    "SiteError",
    "SiteIssue",
    "Switch",
    "load_site",
]
