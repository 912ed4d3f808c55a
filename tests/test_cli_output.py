"""The read commands' plumbing without a service (fast tier): TSV and CSV write numbers plain
and a missing value empty, the table writes them for the eye; the source is picked in the
documented order; an API that is not there is a message, not a traceback."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
import typer

from twin.broker import free_port
from twin.cli.output import Column, Format, emit_rows
from twin.cli.source import DEFAULT_DB, api_get, pick_source

ROWS = [
    {"id": "r01", "power_kw": 1234.5, "gpus": 72, "note": 'a "quoted", value'},
    {"id": "r02", "power_kw": None, "gpus": None, "note": None},
    {"id": "r03", "power_kw": float("nan"), "gpus": 8, "note": "tab\there"},
]
COLS = [
    Column("id", "id"),
    Column("power_kw", "power kW", digits=2),
    Column("gpus", "GPUs", digits=0),
    Column("note", "note"),
]


def test_tsv_numbers_plain_and_missing_empty(capsys: pytest.CaptureFixture[str]) -> None:
    emit_rows(ROWS, COLS, Format.tsv, None)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "id\tpower_kw\tgpus\tnote",
        'r01\t1234.50\t72\ta "quoted", value',
        "r02\t\t\t",
        "r03\t\t8\ttab here",
    ]


def test_csv_quotes_and_table_keeps_separators(capsys: pytest.CaptureFixture[str]) -> None:
    emit_rows(ROWS, COLS, Format.csv, None)
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[1] == ["r01", "1234.50", "72", 'a "quoted", value']
    assert rows[2] == ["r02", "", "", ""]
    emit_rows(ROWS, COLS, Format.table, 0)
    table = capsys.readouterr().out
    assert "1,234.50" in table and "-" in table


def test_source_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DCTWIN_API_URL", raising=False)
    assert pick_source(None, None).db == DEFAULT_DB
    assert pick_source(None, Path("x.duckdb")).db == Path("x.duckdb")
    assert pick_source("http://127.0.0.1:8420/", None).api == "http://127.0.0.1:8420"
    monkeypatch.setenv("DCTWIN_API_URL", "http://127.0.0.1:9")
    assert pick_source(None, None).api == "http://127.0.0.1:9"
    assert pick_source(None, Path("x.duckdb")).db == Path("x.duckdb")  # --db wins over the env
    with pytest.raises(typer.Exit):
        pick_source("http://a", Path("x.duckdb"))
    monkeypatch.setenv("DCTWIN_API_URL", "127.0.0.1:8420")
    with pytest.raises(typer.Exit):
        pick_source(None, None)


def test_an_api_that_is_not_there_is_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(typer.Exit) as e:
        api_get(url, "/api/v1/status")
    assert e.value.exit_code == 2
    err = capsys.readouterr().err
    assert f"cannot reach the dctwin API at {url}" in err and "--db" in err
