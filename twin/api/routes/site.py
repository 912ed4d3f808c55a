"""The site model: /api/v1/site."""

from __future__ import annotations

from fastapi import APIRouter

from twin.api import models as m
from twin.api.deps import BAD, V1, Api, site_or_404

router = APIRouter(prefix=V1, tags=["site"])


@router.get("/site", response_model=m.SiteResponse, responses=BAD)
def site_model(api: Api) -> m.SiteResponse:
    """The site model: halls, rows, racks (grid positions), nodes, PDUs, CDUs, links,
    fleets."""
    site = site_or_404(api.ctx)
    return m.SiteResponse(
        name=site.name,
        counts=m.SiteCounts(
            halls=len(site.halls),
            rows=sum(len(h.rows) for h in site.halls),
            racks=len(site.racks),
            nodes=len(site.nodes),
            gpus=sum(len(n.gpu_ids()) for n in site.nodes),
            pdus=len(site.pdus),
            cdus=len(site.cdus),
            links=len(site.links),
            fleets=len(site.fleets),
        ),
        site=site,
    )
