"""Secrets out of every message that quotes a config file (issue 28): a hook file with a YAML
syntax error on the line holding a routing key or a Slack URL leaks no 8-character run of the
secret through `dctwin rules check --hooks` (text and JSON), the stderr of `dctwin serve` at
start, or the service's log on a SIGHUP reload; and the log redaction blanks fragments of
registered secrets, not only whole values."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from collectors.mqtt import wait_until
from twin.redact import FRAGMENT_LEN, MASK, redact_text, register_secret

from .helpers import REPO, SMALL_SITE

RULES = REPO / "deploy" / "alert_rules.yaml"
PD_KEY = "Rk3y0123456789abcdef0123456789ab"
SLACK_TOKENS = ("T0SECRETX", "B0SECRETY", "sl4ckS3cretT0kenAbc")
SLACK_URL = "https://hooks.slack.com/services/" + "/".join(SLACK_TOKENS)

BROKEN = {
    # PyYAML quotes the line around the problem: 31 of the key's 32 characters
    "routing_key": (
        "hooks:\n  - type: pagerduty\n    name: pd\n"
        f"    url: http://127.0.0.1:9/v2/enqueue\n    routing_key: {PD_KEY}: x\n"
    ),
    # an unterminated quoted URL: the snippet starts at the quote
    "slack_url": f'hooks:\n  - {{type: slack, name: chat, url: "{SLACK_URL}}}\n',
    # JSON (a YAML subset) with the key on the broken line
    "json": (
        '{"hooks": [{"type": "pagerduty", "name": "pd", "url": "http://127.0.0.1:9/x",'
        f' "routing_key": "{PD_KEY}" "oops": 1}}]}}\n'
    ),
}


def fragments(secret: str) -> list[str]:
    n = FRAGMENT_LEN
    return [secret[i : i + n] for i in range(len(secret) - n + 1)]


def assert_no_fragment(text: str) -> None:
    for secret in (PD_KEY, *SLACK_TOKENS):
        for frag in fragments(secret):
            assert frag not in text, (frag, text[-2000:])


def test_the_redaction_blanks_any_8_character_run_of_a_registered_secret(
    monkeypatch: pytest.MonkeyPatch,
):
    # the registry is process-wide: start from an empty one, whatever other tests registered
    import twin.redact as redact

    monkeypatch.setattr(redact, "_secrets", set())
    monkeypatch.setattr(redact, "_fragments", set())
    key = "q9" + PD_KEY[2:]
    register_secret(key)
    out = redact_text(f"found at '{key[1:]}' and '{key[:-1]}' and {key[5:14]} here")
    assert_no_fragment(out.replace(MASK, ""))
    for frag in fragments(key):
        assert frag not in out
    assert out.count(MASK) == 3 and out.endswith(" here")
    # a URL's scheme and host are not secret; its path tokens are, plain words are not
    register_secret("https://hooks.example.com/services/Zz0SECRET1/abc")
    out = redact_text("POST hooks.example.com/services/Zz0SECRET1 and 9 services; https://x")
    assert "Zz0SECRE" not in out and "0SECRET1" not in out
    assert "9 services" in out and "https://x" in out


def _dctwin(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "twin.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


@pytest.mark.slow
@pytest.mark.parametrize("shape", list(BROKEN))
def test_rules_check_and_serve_say_where_a_hook_file_breaks_without_its_secrets(
    tmp_path: Path, shape: str
) -> None:
    hooks = tmp_path / "hooks.yaml"
    hooks.write_text(BROKEN[shape])
    r = _dctwin("rules", "check", str(RULES), "--hooks", str(hooks))
    assert r.returncode == 1, r.stderr
    assert str(hooks) in r.stderr and "line" in r.stderr, r.stderr
    assert_no_fragment(r.stdout + r.stderr)
    r = _dctwin("rules", "check", str(RULES), "--hooks", str(hooks), "--json")
    assert r.returncode == 1
    json.loads(r.stdout)
    assert_no_fragment(r.stdout + r.stderr)
    r = _dctwin(
        *("serve", "--site", str(SMALL_SITE), "--db", str(tmp_path / "s.duckdb")),
        *("--rules", str(RULES), "--hooks", str(hooks), "--broker", "127.0.0.1:1"),
    )
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert str(hooks) in r.stderr, r.stderr
    assert_no_fragment(r.stdout + r.stderr)


@pytest.mark.mqtt
@pytest.mark.slow
def test_a_sighup_with_a_broken_hook_file_logs_no_piece_of_its_secrets(
    broker: Any, tmp_path: Path
) -> None:
    hooks, log = tmp_path / "hooks.yaml", tmp_path / "serve.log"
    hooks.write_text(
        "hooks:\n  - type: pagerduty\n    name: pd\n    url: http://127.0.0.1:9/v2/enqueue\n"
        f"    routing_key: {PD_KEY}\n"
        f"  - {{type: slack, name: chat, url: '{SLACK_URL}'}}\n"
    )
    p = subprocess.Popen(
        [
            *(sys.executable, "-m", "twin.cli", "serve", "--broker", broker.address),
            *("--db", str(tmp_path / "s.duckdb"), "--site", str(SMALL_SITE), "--no-api"),
            *("--calibrate-every", "0", "--rules", str(RULES), "--hooks", str(hooks)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        env={**os.environ, **broker.client_env()},
        cwd=REPO,
    )
    try:
        assert wait_until(lambda: b"serving:" in log.read_bytes() or p.poll() is not None, 60)
        for n, shape in enumerate(("routing_key", "slack_url", "json"), 1):
            hooks.write_text(BROKEN[shape])
            p.send_signal(signal.SIGHUP)
            assert wait_until(lambda n=n: log.read_text().count("reload refused") == n, 20)
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(30)
    text = log.read_text()
    assert str(hooks) in text and "line" in text
    assert_no_fragment(text)
