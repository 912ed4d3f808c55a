"""Calibration: fit every device of the site against windows of telemetry from the store."""
