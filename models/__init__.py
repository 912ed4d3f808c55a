"""The physics of dctwin: pure, vectorized numpy/scipy functions. No I/O, no DuckDB, no MQTT."""
