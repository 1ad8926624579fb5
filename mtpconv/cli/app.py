"""The ``mtpconv`` Typer app: each command parses its flags, calls one function, renders.

Every known failure is an :class:`~mtpconv.errors.MtpconvError`; :func:`main` turns
it into one ``Error: ...`` line on stderr and its exit code, each library parameter it
names (:class:`~mtpconv.errors.Param`) written as the running command's flag: so a
command's parameters are called as the keywords of the library function it calls
(``corpora`` takes ``--corpus``). A usage error
(a bad flag, a wrong choice, a missing argument) into one ``Error: ...`` line and
exit 2, before anything is read or written. Tracebacks only with ``--debug``.
Library functions are imported inside their command so ``mtpconv --help`` does not
load torch or huggingface_hub. Commands are registered, and so listed, in the order of
the workflow (inspect, quantize-mtp, build-draft-vocab, fix-exclusions,
set-draft-window, verify, publish, eval), each with an example under its help.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, NoReturn, TypeVar

import typer
from typer.core import TyperGroup, TyperOption

from mtpconv import __version__, console
from mtpconv.cli import render
from mtpconv.cli.options import (
    BalanceTpOpt,
    BaseModelOpt,
    BatchOpt,
    BranchOpt,
    ClearOpt,
    CommitMessageOpt,
    CopyOpt,
    CopyShardsOpt,
    CorpusOpt,
    CreatePrOpt,
    DebugOpt,
    DestinationArg,
    DeviceOpt,
    DraftVocabOpt,
    DraftVocabSizeOpt,
    DraftWindowOpt,
    DryRunOpt,
    EngineArgOpt,
    EvalCorpusOpt,
    EvalMaxTokensOpt,
    EvalPromptsOpt,
    EvalVariantArg,
    FixDestinationArg,
    ForceOpt,
    FullOpt,
    GeneratedWeightOpt,
    GenerateOpt,
    HeadDtypeOpt,
    InPlaceOpt,
    JsonOpt,
    KeepCardOpt,
    MaxNewTokensOpt,
    MaxTokensOpt,
    NoSaveOpt,
    OutputOpt,
    PlotOpt,
    PrivateOpt,
    PromptsOpt,
    PublishDryRunOpt,
    QuietOpt,
    RepoIdOpt,
    RevisionOpt,
    RowsOpt,
    SeedOpt,
    SizeOpt,
    SourceArg,
    SpecTokensOpt,
    TemperatureOpt,
    TextFieldOpt,
    TokenOpt,
    TopPOpt,
    UpcastOpt,
    VariantDirArg,
    WindowArg,
)
from mtpconv.conversion_options import Device, HeadDtype
from mtpconv.errors import Param

app = typer.Typer(
    name="mtpconv",
    help="Quantize the MTP drafter of a checkpoint to FP8, build a truncated draft "
    "vocabulary, repair quant configs, publish the -mtpfp8 variant, and measure it in vLLM.",
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help: typer's rich panels print a <bool> type after every flag (--help too).
    rich_markup_mode=None,
    # Use a wide terminal's width (click stops at 80 columns by default).
    context_settings={"max_content_width": 120},
)


@dataclass
class _Run:
    """This run's settings: tracebacks (``--debug``), and the long flag of each option of
    the command that runs, by its parameter's name (``{"size": "--size"}``)."""

    debug: bool = False
    flags: dict[str, str] = field(default_factory=dict)


_run = _Run()

_Command = TypeVar("_Command", bound=Callable[..., None])


def _command(name: str, *, example: str) -> Callable[[_Command], _Command]:
    """Register a command (in the order they are registered: the workflow's, as the help
    lists them) with ``example`` under its help. The list of commands shows the first
    paragraph of its docstring whole: click would cut it to fit 80 columns."""

    def register(function: _Command) -> _Command:
        summary = (function.__doc__ or "").split("\n\n")[0]
        command = app.command(name, short_help=" ".join(summary.split()), epilog=f"\b\nExample:\n  {example}")
        return command(function)

    return register


def _apply_switches(*, quiet: bool, debug: bool) -> None:
    """Turn on --quiet / --debug, whether given before the command or after it."""
    if quiet:
        console.set_quiet(True)
    if debug:
        _run.debug = True


def debug_requested() -> bool:
    """Whether this run asked for tracebacks (``--debug``, before or after the command)."""
    return _run.debug


def as_flag(param: Param) -> str:
    """A library parameter an error names, as the running command's flag for it:
    ``--size 66``, ``--force`` (a bool names a switch), ``--text-field``; as the library
    writes it (``size=66``) where the command has no option of that name."""
    flag = _run.flags.get(param.name)
    if flag is None:
        return str(param)
    return flag if param.value is None or isinstance(param.value, bool) else f"{flag} {param.value}"


def _usage_error(message: str) -> NoReturn:
    """A usage error our own checks find: one line, exit 2, before any work."""
    console.error(message)
    raise typer.Exit(2)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"mtpconv {__version__}")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def _global_options(
    ctx: typer.Context,
    *,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version_callback, is_eager=True, help="Show version."),
    ] = False,
) -> None:
    # Reset first: in-process callers (tests, embedders) run several commands.
    console.set_quiet(False)
    _run.debug = False
    _run.flags = {}
    _apply_switches(quiet=quiet, debug=debug)
    if ctx.invoked_subcommand is None:  # bare `mtpconv`: the help, as a usage error
        typer.echo(ctx.get_help(), err=True)
        raise typer.Exit(2)
    group = ctx.command
    command = group.get_command(ctx, ctx.invoked_subcommand) if isinstance(group, TyperGroup) else None
    _run.flags = {
        option.name: next((o for o in option.opts if o.startswith("--")), option.opts[0])
        for option in (command.params if command is not None else [])
        if isinstance(option, TyperOption) and option.name
    }


@_command("inspect", example="mtpconv inspect nvidia/Qwen3.5-397B-A17B-NVFP4")
def inspect_cmd(
    source: SourceArg,
    *,
    revision: RevisionOpt = None,
    draft_vocab_size: DraftVocabSizeOpt = 32768,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """What a checkpoint is, what is wrong with its quant config, what the drafter costs."""
    _apply_switches(quiet=quiet, debug=debug)
    from mtpconv.commands.inspect import inspect_checkpoint

    report = inspect_checkpoint(source, revision=revision, draft_vocab_size=draft_vocab_size)
    render.show(report, render.render_inspect, as_json=as_json)
    if report.layout_error is not None:  # the report is printed; the drafter's family is unknown
        from mtpconv.errors import UnknownFamilyError

        raise UnknownFamilyError(report.layout_error)


@_command("quantize-mtp", example="mtpconv quantize-mtp ./ckpt ./ckpt-mtpfp8 --draft-vocab vocab.pt")
def quantize_mtp_cmd(
    source: SourceArg,
    destination: DestinationArg,
    *,
    revision: RevisionOpt = None,
    draft_vocab: DraftVocabOpt = None,
    draft_head_dtype: HeadDtypeOpt = HeadDtype.FP8,
    device: DeviceOpt = Device.AUTO,
    dry_run: DryRunOpt = False,
    force: ForceOpt = False,
    copy: CopyOpt = False,
    draft_window: DraftWindowOpt = None,
    fp8_from_4bit: UpcastOpt = False,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Write the -mtpfp8 variant: drafter linears in FP8, everything else byte-identical."""
    _apply_switches(quiet=quiet, debug=debug)
    from mtpconv.commands.quantize_mtp import quantize_mtp

    with console.byte_progress() as progress:
        report = quantize_mtp(
            source,
            destination,
            revision=revision,
            draft_vocab=draft_vocab,
            draft_head_dtype=draft_head_dtype,
            device=device,
            dry_run=dry_run,
            force=force,
            copy=copy,
            draft_window=draft_window,
            fp8_from_4bit=fp8_from_4bit,
            progress=progress,
        )
    render.show(report, render.render_conversion, as_json=as_json)


@_command(
    "build-draft-vocab",
    example="mtpconv build-draft-vocab ./ckpt --corpus chats.jsonl --size 32768 --output vocab.pt",
)
def build_draft_vocab_cmd(
    source: SourceArg,
    *,
    size: SizeOpt,
    corpora: CorpusOpt = None,
    output: OutputOpt = Path("mtp_draft_vocab_ids.pt"),
    revision: RevisionOpt = None,
    text_field: TextFieldOpt = "text",
    max_tokens: MaxTokensOpt = None,
    eval_corpora: EvalCorpusOpt = None,
    balance_tp: BalanceTpOpt = None,
    plot: PlotOpt = None,
    generate: GenerateOpt = None,
    eval_prompts: EvalPromptsOpt = None,
    max_new_tokens: MaxNewTokensOpt = 256,
    temperature: TemperatureOpt = 0.7,
    top_p: TopPOpt = 0.95,
    seed: SeedOpt = 0,
    generated_weight: GeneratedWeightOpt = None,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Count token frequencies (of a corpus or the model's own outputs); keep the top-K ids."""
    _apply_switches(quiet=quiet, debug=debug)
    if not corpora and generate is None:
        _usage_error(
            "Missing option '--corpus' (or --generate PROMPTS.jsonl): give a corpus, prompts, or both."
        )
    from mtpconv.commands.build_draft_vocab import build_draft_vocab
    from mtpconv.draft_vocab.generate import SamplingSettings

    sampling = SamplingSettings(max_new_tokens, temperature, top_p, seed)
    # One live bar at a time: generation (tokens/s) is the long part when asked for.
    bar = console.count_progress("tokens") if generate is not None else console.byte_progress()
    with bar as progress:
        report = build_draft_vocab(
            source,
            corpora or [],
            size,
            output,
            revision=revision,
            text_field=text_field,
            max_tokens=max_tokens,
            eval_corpora=eval_corpora or (),
            balance_tp=balance_tp,
            plot=plot,
            progress=None if generate is not None else progress,
            generate=generate,
            eval_prompts=eval_prompts,
            sampling=sampling,
            generated_weight=generated_weight,
            generation_progress=progress if generate is not None else None,
        )
    render.show(report, render.render_draft_vocab, as_json=as_json)


@_command("fix-exclusions", example="mtpconv fix-exclusions ./ckpt ./ckpt-fixed")
def fix_exclusions_cmd(
    source: SourceArg,
    destination: FixDestinationArg = None,
    *,
    revision: RevisionOpt = None,
    in_place: InPlaceOpt = False,
    dry_run: DryRunOpt = False,
    force: ForceOpt = False,
    copy: CopyShardsOpt = False,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Exclude every module stored unquantized but declared quantized (the mtp.fc gap)."""
    _apply_switches(quiet=quiet, debug=debug)
    if in_place and destination is not None:
        _usage_error("give either DST or --in-place, not both.")
    if not in_place and destination is None:
        _usage_error(
            "give a destination directory, or --in-place to edit SRC's JSON files "
            "(a .bak copy of each is kept)."
        )
    from mtpconv.commands.fix_exclusions import IN_PLACE, fix_exclusions

    report = fix_exclusions(
        source,
        IN_PLACE if destination is None else destination,
        revision=revision,
        force=force,
        copy=copy,
        dry_run=dry_run,
    )
    render.show(report, render.render_fix, as_json=as_json)


@_command("set-draft-window", example="mtpconv set-draft-window ./ckpt-mtpfp8 8192")
def set_draft_window_cmd(
    directory: VariantDirArg,
    window: WindowArg = None,
    *,
    clear: ClearOpt = False,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Set or remove the drafter's attention window of a variant (rewrites only mtpconv.json)."""
    _apply_switches(quiet=quiet, debug=debug)
    if clear and window:
        _usage_error("give either N or --clear, not both.")
    if not clear and window is None:
        _usage_error("give the window N in tokens, or --clear (or 0) to remove it.")
    from mtpconv.commands.set_draft_window import set_draft_window

    report = set_draft_window(directory, None if clear or not window else window)
    render.show(report, render.render_draft_window, as_json=as_json)


@_command("verify", example="mtpconv verify ./ckpt-mtpfp8")
def verify_cmd(
    directory: VariantDirArg,
    *,
    full: FullOpt = False,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Check a -mtpfp8 variant against its manifest; exit 1 naming every changed file."""
    _apply_switches(quiet=quiet, debug=debug)
    from mtpconv.commands.verify import verify_variant

    with console.byte_progress() as progress:
        report = verify_variant(directory, full=full, progress=progress)
    render.show(report, render.render_verify, as_json=as_json)
    if not report.ok:
        if as_json:
            console.error(render.verify_failure(report))
        raise typer.Exit(1)


@_command("publish", example="mtpconv publish ./ckpt-mtpfp8 --repo-id me/ckpt-mtpfp8")
def publish_cmd(
    directory: VariantDirArg,
    *,
    repo_id: RepoIdOpt = None,
    private: PrivateOpt = False,
    revision: BranchOpt = None,
    create_pr: CreatePrOpt = False,
    token: TokenOpt = None,
    commit_message: CommitMessageOpt = None,
    dry_run: PublishDryRunOpt = False,
    keep_card: KeepCardOpt = False,
    base_model: BaseModelOpt = None,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Verify a -mtpfp8 variant against its manifest, write its model card, upload it."""
    _apply_switches(quiet=quiet, debug=debug)
    from mtpconv.commands.publish import plan_publish, upload_plan

    with console.byte_progress() as progress:
        plan = plan_publish(
            directory,
            repo_id=repo_id,
            private=private,
            revision=revision,
            create_pr=create_pr,
            token=token,
            commit_message=commit_message,
            keep_card=keep_card,
            base_model=base_model,
            offline=dry_run,
            notify=console.info,
            progress=progress,
        )
    if dry_run:
        render.show(plan, render.render_publish_plan, as_json=as_json)
        return
    result = upload_plan(
        plan,
        token=token,
        notify=console.info,
        show_progress=not console.is_quiet() and console.err_console.is_terminal,
    )
    render.show(result, render.render_publish_result, as_json=as_json)


@_command("eval", example="mtpconv eval ./ckpt ./ckpt-mtpfp8 --batch 1,8")
def eval_cmd(
    source: SourceArg,
    variant: EvalVariantArg,
    *,
    prompts: PromptsOpt = None,
    k: SpecTokensOpt = 3,
    batch: BatchOpt = "1,8",
    max_tokens: EvalMaxTokensOpt = 128,
    rows: RowsOpt = None,
    engine_arg: EngineArgOpt = None,
    no_save: NoSaveOpt = False,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Serve SRC and VARIANT in vLLM, a fresh process per row: same output? accepted? faster?"""
    _apply_switches(quiet=quiet, debug=debug)
    import shlex
    import sys

    from mtpconv.commands.evaluate import evaluate, parse_batches, parse_engine_args, parse_rows

    report = evaluate(
        source,
        variant,
        prompts_file=prompts,
        num_speculative_tokens=k,
        batches=parse_batches(batch),
        max_tokens=max_tokens,
        rows=parse_rows(rows),
        engine_args=parse_engine_args(engine_arg or []),
        save=not no_save,
        command=shlex.join(["mtpconv", *sys.argv[1:]]),
        notify=console.info,
    )
    render.show(report, render.render_eval, as_json=as_json)
    if not report.ok:
        raise typer.Exit(1)
