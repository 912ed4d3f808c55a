"""What the twin concludes from its telemetry, live: headroom of every limit (``headroom``), hot
spots (``hotspots``), underused and drained inference fleets (``fleets``, ``fleet_drain``), which
kinds of telemetry are missing (``coverage``), and the detection pass that runs them all and
feeds the alert engine (``detect``). The figures themselves are the chain's (``twin.chain``),
which a what-if replay (``twin.replay``) runs too.
"""
