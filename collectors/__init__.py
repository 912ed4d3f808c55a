"""Edge agents that publish contract messages over MQTT, and the wire contract.

Collectors import only ``collectors`` and third-party libraries, so a GPU node installs no DuckDB
or Streamlit. The site simulator builds on the site model and lives in ``twin.simulator``.
"""
