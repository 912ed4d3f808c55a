"""The Streamlit operator console, a client of the service's HTTP API (issue 6)."""
