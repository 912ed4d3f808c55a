"""An snmpsim agent for the SNMP collector's tests: serve .snmprec data on a free UDP port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from collectors.base import CollectorError
from collectors.snmp import SnmpPduCollector

#: pysnmp's asyncio leaves a pending task behind at close; tests filter this log line
ASYNCIO_LEAK = "Task was destroyed but it is pending"
RESPONDER = Path(sys.executable).with_name("snmpsim-command-responder")


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(data: Path, tmp: Path, profile: str, community: str) -> Iterator[int]:
    """snmpsim serving ``data`` (read in place) on a free port; yields the port once a poll of
    ``community`` with ``profile`` answers, and stops the agent afterwards."""
    port = _free_udp_port()
    log = (tmp / "snmpsim.log").open("w")
    proc = subprocess.Popen(
        [
            str(RESPONDER),
            f"--data-dir={data}",
            f"--cache-dir={tmp / 'cache'}",
            f"--agent-udpv4-endpoint=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "SNMPSIM_ALLOW_ROOT": "true"},  # it refuses root otherwise
    )
    try:
        probe = SnmpPduCollector(
            "127.0.0.1",
            site="lab",
            profile=profile,
            community=community,
            port=port,
            timeout_s=0.5,
            retries=0,
        )
        deadline = time.monotonic() + 60
        while True:  # wait until the agent has indexed its data and answers
            try:
                probe.poll()
                break
            except CollectorError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail(f"snmpsim did not come up: {(tmp / 'snmpsim.log').read_text()}")
        probe.close()
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
