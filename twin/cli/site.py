"""`dctwin site ...`: tools for site files (``generate``: a large, valid site for scale tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from twin.cli.common import err, fail

site_app = typer.Typer(
    help="Site files: generate a large site for scale tests and benchmarks.",
    no_args_is_help=True,
)


@site_app.command("generate")
def generate(
    gpus: Annotated[
        int, typer.Option(help="GPUs in the site; rounded to the nearest multiple of 8.")
    ],
    halls: Annotated[int, typer.Option(help="Halls (hall-a, hall-b, ...).")] = 1,
    nvl72_share: Annotated[
        float, typer.Option(help="Share of the GPUs in GB200 NVL72 racks; the rest in HGX racks.")
    ] = 0.5,
    inference_share: Annotated[
        float, typer.Option(help="Share of each hall's racks in inference fleets; rest training.")
    ] = 0.3,
    seed: Annotated[int, typer.Option(help="Random seed; same seed, same file.")] = 0,
    shards: Annotated[
        int,
        typer.Option(
            help="Write a shards: section with this many shards (whole halls, or halls split by"
            " rows when there are more shards than halls); 0: none."
        ),
    ] = 0,
    racks_per_row: Annotated[int, typer.Option(help="Racks per row.")] = 16,
    spines_per_hall: Annotated[int, typer.Option(help="Spine switches per hall.")] = 4,
    name: Annotated[str, typer.Option(help="Site name (the <site> of MQTT topics).")] = "gen",
    api_port: Annotated[
        int, typer.Option(help="Port of the first shard's api_url; the next shards count up.")
    ] = 8421,
    out: Annotated[
        Path | None, typer.Option(help="Write the site YAML here (default: standard output).")
    ] = None,
) -> None:
    """Generate a valid site: GB200 NVL72 and HGX racks, A/B PDUs, CDUs on loops, leaf/spine
    links, training and inference fleets, sized by the rules of twin/site/generate.py.

    A summary (counts, design IT load) goes to stderr as one JSON line.
    """
    from pydantic import ValidationError

    from twin.site.generate import GenerateOptions, generate_site

    try:
        options = GenerateOptions(
            gpus=gpus,
            halls=halls,
            nvl72_share=nvl72_share,
            inference_share=inference_share,
            seed=seed,
            shards=shards,
            racks_per_row=racks_per_row,
            spines_per_hall=spines_per_hall,
            name=name,
            api_port=api_port,
        )
    except ValidationError as e:
        first = e.errors()[0]
        option = "--" + str(first["loc"][0]).replace("_", "-")
        raise fail(f"{option}: {first['msg']} (got {first['input']!r})") from None
    try:
        result = generate_site(options)
    except ValueError as e:
        raise fail(str(e)) from None
    for note in result.notes:
        err.print(f"note: {note}", highlight=False)
    if out is None:
        typer.echo(result.text, nl=False)
    else:
        try:
            out.write_text(result.text, encoding="utf-8")
        except OSError as e:
            raise fail(f"--out {out}: cannot write: {e.strerror or e}") from None
    err.print(json.dumps(result.summary), highlight=False, soft_wrap=True)
