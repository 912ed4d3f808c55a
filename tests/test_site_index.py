"""The one site index (twin/site/index.py) and the lookups built from it: the API's
SiteLookups, the alert topology and the simulator's id arrays agree with the site model."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from twin.alerts.topology import Topology
from twin.simulator.engine import SiteSimulator
from twin.site import load_site
from twin.site.index import SiteLookups, index_site

from .helpers import DEMO_SITE, SMALL_SITE


@pytest.fixture(params=[SMALL_SITE, DEMO_SITE], ids=["small", "demo"])
def site(request):
    return load_site(request.param)


def test_the_index_places_every_gpu_node_and_rack_as_the_site_model_does(site):
    idx = index_site(site)
    assert idx.node_names == [n.name for n in site.nodes]
    assert idx.rack_names == [r.name for r in site.racks]
    assert idx.gpu_ids == [g for n in site.nodes for g in n.gpu_ids()]
    for n_i, node in enumerate(site.nodes):
        assert idx.node_gpus(n_i) == node.gpu_ids()
        assert idx.rack_names[idx.node_rack[n_i]] == site.rack_of_node[node.name].name
        assert idx.node_uuids[n_i] == tuple(node.gpu_uuids or ())
    for r_i, rack in enumerate(site.racks):
        assert [idx.node_names[n] for n in idx.rack_nodes(r_i)] == [n.name for n in rack.nodes]
        assert idx.rack_cdu_name[r_i] == rack.cdu
    where = {r.name: (h.name, row.name) for h in site.halls for row in h.rows for r in row.racks}
    assert dict(
        zip(idx.rack_names, zip(idx.rack_hall, idx.rack_row, strict=True), strict=True)
    ) == (where)
    assert list(idx.gpu_slot[: len(site.nodes[0].gpu_ids())]) == list(
        range(len(site.nodes[0].gpu_ids()))
    )


def test_the_api_lookups_and_the_alert_topology_come_from_the_index(site):
    look = SiteLookups.build(site)
    topo = Topology.from_site(site)
    for node in site.nodes:
        rack = site.rack_of_node[node.name].name
        assert look.node_rack[node.name] == rack
        for slot, gid in enumerate(node.gpu_ids()):
            assert look.gpu_node[gid] == (node.name, slot)
            assert topo.ancestors(("gpu", gid), "power")[:2] == [
                ("node", node.name),
                ("rack", rack),
            ]
        fleet = site.fleet_of_node.get(node.name)
        assert topo.fleet.get(("node", node.name)) == (("fleet", fleet.name) if fleet else None)
    for rack in site.racks:
        for p in rack.pdus:
            assert rack.name in look.pdu_racks[p]
            assert ("pdu", p) in topo.ancestors(("rack", rack.name), "power")
        if rack.cdu:
            assert rack.name in look.cdu_racks[rack.cdu]
            assert topo.ancestors(("rack", rack.name), "cooling") == [("cdu", rack.cdu)]


def test_the_simulator_numbers_gpus_in_the_index_order(site):
    sim = SiteSimulator(site, start=datetime(2026, 1, 1, tzinfo=UTC))
    idx = index_site(site)
    assert sim._gpu_ids == idx.gpu_ids
    assert list(sim._node_rack) == list(idx.node_rack)
