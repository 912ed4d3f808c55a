"""Edge agents that publish contract messages over MQTT, and the site simulator.

Collectors import only ``collectors`` and third-party libraries, so a GPU node installs no DuckDB
or Streamlit. The simulator is the one exception: it runs the physics of ``models`` (numpy only)
on a site file parsed by ``twin.site`` (pydantic and PyYAML only).
"""
