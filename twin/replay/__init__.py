"""Replay recorded telemetry and run what-if scenarios through the calibrated twin."""
