"""`dctwin site-view`: bad shards, site files and addresses end in one clear error line (exit 2),
through the command line as a user meets them."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from twin.cli import app

from .helpers import SMALL_SITE


def run(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, ["site-view", *args])
    return r.exit_code, r.output


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((), "give exactly one of --shards URL,... and --site FILE"),
        (("--shards", "http://a:1", "--site", "x.yaml"), "give exactly one of"),
        (("--shards", "hall-a=ftp://x:1"), "--shards item 1: 'ftp://x:1' is not an http(s) URL"),
        (("--shards", "http://h:1,a=http://h:2,a=http://h:3"), "shard 'a' given twice"),
        (("--shards", "Hall A=http://h:1"), "shard name 'Hall A' is not a slug"),
        (("--shards", " , "), "--shards: no shard given"),
        (("--site", "no/such/site.yaml"), "--site no/such/site.yaml: No such file"),
        (("--site", str(SMALL_SITE)), "no shards: list; name the shards' APIs with --shards"),
        (("--shards", "http://h:1", "--port", "70000"), "--port 70000: expected 0..65535"),
    ],
)
def test_bad_input_is_one_clear_line(args: tuple[str, ...], said: str) -> None:
    code, out = run(*args)
    assert code == 2, out
    assert said in out and "Traceback" not in out
    assert len([line for line in out.splitlines() if line.strip()]) == 1, out


def test_a_shard_without_api_url_is_named(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(
        "name: x\nshards:\n  - {name: hall-a, halls: [hall-a], api_url: 'http://h:8420'}\n"
        "  - {name: hall-b, halls: [hall-b]}\n"
    )
    code, out = run("--site", str(site))
    assert code == 2 and f"--site {site}: shards[1] (hall-b): no api_url" in out


def test_a_taken_port_is_said(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        code, out = run("--shards", "http://127.0.0.1:9", "--port", str(port))
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in out
