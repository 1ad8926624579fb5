"""The ``mtpconv`` command line: parse flags, call one function, render its record.

Every known failure is an :class:`~mtpconv.errors.MtpconvError`; ``main`` turns it
into one ``Error: ...`` line on stderr and its exit code (traceback only with
``--debug``). Nothing else in the package imports typer.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from mtpconv import __version__, console
from mtpconv.errors import MtpconvError

app = typer.Typer(
    name="mtpconv",
    help="Quantize the MTP drafter of a checkpoint to FP8, build a truncated draft "
    "vocabulary, repair quant configs, and publish the -mtpfp8 variant.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_DEBUG_ENV = "MTPCONV_DEBUG"

# Reusable option types, defined once and used by every command.
SourceArg = Annotated[
    str, typer.Argument(help="Source checkpoint: a local directory or a Hub repo id.")
]
RevisionOpt = Annotated[
    str | None, typer.Option("--revision", help="Hub revision (branch, tag or commit).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace an existing destination.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Show the plan; write nothing.")]


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"mtpconv {__version__}")
        raise typer.Exit()


@app.callback()
def _global_options(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show tracebacks for errors.", envvar=_DEBUG_ENV)
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress or notices.")] = False,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version_callback, is_eager=True, help="Show version."),
    ] = False,
) -> None:
    if debug:
        os.environ[_DEBUG_ENV] = "1"
    console.set_quiet(quiet)


@app.command("inspect")
def inspect_cmd(
    source: SourceArg,
    revision: RevisionOpt = None,
    draft_vocab_size: Annotated[
        int, typer.Option("--draft-vocab-size", min=1, help="K for the draft-head cost estimate.")
    ] = 32768,
    as_json: JsonOpt = False,
) -> None:
    """What a checkpoint is, what is wrong with its quant config, what the drafter costs."""
    from mtpconv.inspect import inspect_checkpoint
    from mtpconv.render import render_inspect

    report = inspect_checkpoint(source, revision=revision, draft_vocab_size=draft_vocab_size)
    if as_json:
        console.emit_json(report.to_dict())
    else:
        render_inspect(report)


def _debug_enabled() -> bool:
    return os.environ.get(_DEBUG_ENV, "") not in ("", "0")


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    try:
        app(args=argv, standalone_mode=True)
    except MtpconvError as exc:
        if _debug_enabled():
            console.err_console.print_exception()
        console.error(str(exc))
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        console.error("interrupted; nothing was left half-written.")
        sys.exit(130)
