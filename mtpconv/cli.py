"""The ``mtpconv`` command line: parse flags, call one function, render its record.

Every known failure is an :class:`~mtpconv.errors.MtpconvError`; ``main`` turns it
into one ``Error: ...`` line on stderr and its exit code (traceback only with
``--debug``). Nothing else in the package imports typer.
"""

from __future__ import annotations

import errno
import os
import signal
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


@app.command("publish")
def publish_cmd(
    directory: Annotated[str, typer.Argument(help="A -mtpfp8 variant written by quantize-mtp.")],
    repo_id: Annotated[
        str | None,
        typer.Option("--repo-id", help="USER/NAME; default: <you>/<source name>-mtpfp8."),
    ] = None,
    private: Annotated[bool, typer.Option("--private", help="Create the repo private.")] = False,
    revision: Annotated[
        str | None, typer.Option("--revision", help="Branch to commit to (created if missing).")
    ] = None,
    create_pr: Annotated[
        bool, typer.Option("--create-pr", help="Open a pull request instead of committing.")
    ] = False,
    token: Annotated[
        str | None, typer.Option("--token", help="Hub token (default: HF_TOKEN or your login).")
    ] = None,
    commit_message: Annotated[
        str | None, typer.Option("--commit-message", help="Message of the upload commit.")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what would be uploaded; contact nothing.")
    ] = False,
    keep_card: Annotated[
        bool, typer.Option("--keep-card", help="Upload the directory's README.md as the card.")
    ] = False,
) -> None:
    """Verify a -mtpfp8 variant against its manifest, write its model card, upload it."""
    from mtpconv.commands.publish import plan_publish, upload_plan
    from mtpconv.units import human_bytes

    with console.byte_progress() as progress:
        plan = plan_publish(
            directory, repo_id=repo_id, private=private, revision=revision,
            create_pr=create_pr, token=token, commit_message=commit_message,
            keep_card=keep_card, offline=dry_run, notify=console.info, progress=progress,
        )  # fmt: skip
    if dry_run:
        where = plan.repo_id + (f" @ {plan.revision}" if plan.revision else "")
        where += " as a pull request" if plan.create_pr else ""
        size = human_bytes(plan.total_bytes)
        typer.echo(f"Would upload {len(plan.items)} files ({size}) to {where}:")
        for item in plan.items:
            note = "  (generated)" if item.local is None else ""
            typer.echo(f"  {human_bytes(item.size):>12}  {item.path_in_repo}{note}")
        if plan.card is not None:
            typer.echo("\n--- README.md (generated) ---\n" + plan.card.rstrip())
        return
    result = upload_plan(
        plan, token=token, notify=console.info,
        show_progress=not console.is_quiet() and console.err_console.is_terminal,
    )  # fmt: skip
    console.info(f"Published {plan.repo_id}.")
    typer.echo(result.pr_url or result.commit_url or result.repo_url or plan.repo_id)

@app.command("quantize-mtp")
def quantize_mtp_cmd(
    source: SourceArg,
    destination: Annotated[str, typer.Argument(help="Output directory of the -mtpfp8 variant.")],
    revision: RevisionOpt = None,
    draft_vocab: Annotated[
        str | None,
        typer.Option("--draft-vocab", help="Ids file from build-draft-vocab: adds a sliced head."),
    ] = None,
    draft_head_dtype: Annotated[
        str, typer.Option("--draft-head-dtype", help="fp8 or bf16 for the draft head.")
    ] = "fp8",
    device: Annotated[
        str, typer.Option("--device", help="auto, cpu or cuda: where the FP8 math runs.")
    ] = "auto",
    dry_run: DryRunOpt = False,
    force: ForceOpt = False,
    copy: Annotated[
        bool, typer.Option("--copy", help="Copy untouched files instead of hard-linking them.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Write the -mtpfp8 variant: drafter linears in FP8, everything else byte-identical."""
    from mtpconv.convert import quantize_mtp
    from mtpconv.render import render_conversion

    with console.byte_progress() as progress:
        report = quantize_mtp(
            source, destination, revision=revision, draft_vocab=draft_vocab,
            draft_head_dtype=draft_head_dtype, device=device, dry_run=dry_run, force=force,
            copy=copy, progress=progress,
        )  # fmt: skip
    if as_json:
        console.emit_json(report.to_dict())
    else:
        render_conversion(report)


@app.command("fix-exclusions")
def fix_exclusions_cmd(
    source: SourceArg,
    destination: Annotated[
        str | None, typer.Argument(help="Output directory (shards are hard-linked).")
    ] = None,
    revision: RevisionOpt = None,
    in_place: Annotated[
        bool, typer.Option("--in-place", help="Edit SRC's two JSON files (keeps .bak copies).")
    ] = False,
    dry_run: DryRunOpt = False,
    force: ForceOpt = False,
    copy: Annotated[
        bool, typer.Option("--copy", help="Copy shards instead of hard-linking them.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Exclude every module stored unquantized but declared quantized (the mtp.fc gap)."""
    from mtpconv.fix_exclusions import fix_exclusions
    from mtpconv.render import render_fix

    report = fix_exclusions(source, destination, revision=revision, in_place=in_place,
                            force=force, copy=copy, dry_run=dry_run)  # fmt: skip
    if as_json:
        console.emit_json(report.to_dict())
    else:
        render_fix(report)


@app.command("build-draft-vocab")
def build_draft_vocab_cmd(
    source: SourceArg,
    corpus: Annotated[
        list[str],
        typer.Option("--corpus", help="Text/JSONL/Parquet file (.gz ok) or directory; repeatable."),
    ],
    size: Annotated[int, typer.Option("--size", min=1, help="K: number of draft vocab ids.")],
    output: Annotated[
        str, typer.Option("--output", "-o", help="Ids file to write (+ OUTPUT.json sidecar).")
    ] = "mtp_draft_vocab_ids.pt",
    revision: RevisionOpt = None,
    text_field: Annotated[
        str, typer.Option("--text-field", help="JSONL field / Parquet column with the text.")
    ] = "text",
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", min=1, help="Stop after counting N tokens.")
    ] = None,
    eval_corpus: Annotated[
        list[str] | None,
        typer.Option("--eval-corpus", help="Held-out corpus for coverage only; repeatable."),
    ] = None,
    balance_tp: Annotated[
        int | None,
        typer.Option("--balance-tp", min=1, help="Same number of ids in each of N vocab shards."),
    ] = None,
    plot: Annotated[
        str | None, typer.Option("--plot", help="Write the coverage curve as a PNG.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Count token frequencies with the checkpoint's tokenizer; keep the top-K ids."""
    from rich.table import Table

    from mtpconv.draft_vocab import build_draft_vocab, resolve_tokenizer_source

    directory, described = resolve_tokenizer_source(source, revision)
    with console.byte_progress() as progress:
        r = build_draft_vocab(
            directory, corpus, size, output, text_field=text_field, max_tokens=max_tokens,
            eval_corpora=eval_corpus or (), balance_tp=balance_tp, plot=plot,
            progress=progress, source_description=described,
        )  # fmt: skip
    if as_json:
        console.emit_json(r.to_dict())
        return
    console.info(f"Counted {r.corpus.tokens:,} tokens in {len(r.corpus.files)} file(s) in "
                 f"{r.seconds:.1f} s ({r.tokens_per_second:,.0f} tokens/s)"
                 + (" (stopped at --max-tokens)" if r.corpus.truncated else "") + ".")  # fmt: skip
    held_out = {p.size: p.coverage for p in r.eval.coverage_table} if r.eval else {}
    table = Table(title=f"Coverage of {r.corpus.tokens:,} corpus tokens", title_justify="left")
    table.add_column("draft vocab size", justify="right")
    table.add_column("corpus", justify="right")
    if r.eval:
        table.add_column(f"held-out ({r.eval.corpus.tokens:,} tokens)", justify="right")
    for p in r.coverage_table:
        row = [f"{p.size:,}" + (" (K)" if p.size == r.size else ""), f"{p.coverage:.2%}"]
        table.add_row(*row, *([f"{held_out[p.size]:.2%}"] if r.eval else []))
    console.out_console.print(table)
    plotted = f"; plot {r.plot}" if r.plot else ""
    typer.echo(f"Wrote {r.output} ({r.size:,} of {r.vocab_size:,} ids, coverage "
               f"{r.coverage:.2%}) and {r.sidecar}{plotted}.")  # fmt: skip


def _debug_enabled() -> bool:
    return os.environ.get(_DEBUG_ENV, "") not in ("", "0")


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    try:  # SIGTERM unwinds like Ctrl-C, so every command cleans up its temporary files
        previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    except ValueError:  # not the main thread (embedded use)
        previous = None
    try:
        app(args=argv, standalone_mode=True)
    except MtpconvError as exc:
        if _debug_enabled():
            console.err_console.print_exception()
        console.error(str(exc))
        sys.exit(exc.exit_code)
    except OSError as exc:
        # The library maps the failures it expects; any other OS failure (a full disk
        # while writing the manifest, a file that cannot be opened) is still one line.
        if _debug_enabled():
            console.err_console.print_exception()
        console.error(_os_error_message(exc))
        sys.exit(1)
    except KeyboardInterrupt:
        console.error("interrupted; nothing was left half-written.")
        sys.exit(130)
    except SystemExit as exc:
        if exc.code == 130:  # typer turns Ctrl-C into a silent exit 130: say it in one line
            console.error("interrupted; nothing was left half-written.")
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _os_error_message(exc: OSError) -> str:
    where = f" ({exc.filename})" if exc.filename else ""
    if exc.errno == errno.ENOSPC:
        return f"no space left on the device{where}; free space and run again."
    return f"{exc.strerror or exc}{where}; run again with --debug for details."
