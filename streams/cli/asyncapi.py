"""``vigil asyncapi`` (mounted by ``streams.cli.main``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def asyncapi(
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Write the document to this file (docs/asyncapi.yaml in the repository); "
            "without it, print it.",
        ),
    ] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Write nothing: exit 1 if the --output file differs from the document.",
        ),
    ] = False,
) -> None:
    """The AsyncAPI 3.0.0 document of vigil's topics, generated from the topic catalogue and
    the Avro schemas (channels, keys, records, alert headers, Kafka bindings). After changing a
    schema or a topic: vigil asyncapi --output docs/asyncapi.yaml"""
    from streams.contracts.asyncapi import generate

    text = generate()
    if check:
        if output is None:
            raise typer.BadParameter("--check needs --output FILE", param_hint="--check")
        current = output.read_text() if output.exists() else None
        if current != text:
            typer.echo(
                f"{output} is not the generated document; run: vigil asyncapi --output {output}",
                err=True,
            )
            raise typer.Exit(1)
        typer.echo(f"{output} is up to date")
        return
    if output is None:
        typer.echo(text, nl=False)
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    typer.echo(f"wrote {output}")
