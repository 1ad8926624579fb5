"""The command line's vocabulary: choice Enums and the option types every command shares.

Each option is declared once here as an ``Annotated`` type and used by every command
that takes it, so a flag is spelled, documented and typed the same way everywhere.
Value options carry a metavar as the README writes it (``SRC``, ``--revision REV``);
flags carry none, so they do not look as if they took a value.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from mtpconv.conversion_options import Device, HeadDtype

DEBUG_ENV = "MTPCONV_DEBUG"

Number = TypeVar("Number", int, float)


def _bounded(low: float, high: float | None = None) -> Callable[[Number | None], Number | None]:
    """A bound checked by a callback, not ``min=``/``max=``: typer prints those as
    ``[x>=1]`` on the option's help row; the error is the one typer gives for them."""

    def check(value: Number | None) -> Number | None:
        if value is not None and value < low:
            raise typer.BadParameter(f"Input should be greater than or equal to {low:g}")
        if value is not None and high is not None and value > high:
            raise typer.BadParameter(f"Input should be less than or equal to {high:g}")
        return value

    return check


_POSITIVE = _bounded(1)


# Switches accepted both before the command (`mtpconv -q inspect DIR`) and after it
# (`mtpconv inspect DIR -q`): the app callback and every command declare them.
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress or notices.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.", envvar=DEBUG_ENV)]

SourceArg = Annotated[
    str,
    typer.Argument(
        metavar="SRC",
        help="Source checkpoint: a local directory or a Hub repo id.",
        show_default=False,
    ),
]
RevisionOpt = Annotated[
    str | None,
    typer.Option("--revision", metavar="REV", help="Hub revision (branch, tag or commit)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace an existing destination.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Show the plan; write nothing.")]
DraftVocabSizeOpt = Annotated[
    int,
    typer.Option(
        "--draft-vocab-size", metavar="K", callback=_POSITIVE, help="K for the draft-head cost estimate."
    ),
]

# quantize-mtp
DestinationArg = Annotated[
    Path,
    typer.Argument(metavar="DST", help="Output directory of the -mtpfp8 variant.", show_default=False),
]
DraftVocabOpt = Annotated[
    Path | None,
    typer.Option(
        "--draft-vocab",
        metavar="IDS.pt",
        exists=True,
        dir_okay=False,
        help="Ids file from build-draft-vocab: adds a sliced head.",
    ),
]
HeadDtypeOpt = Annotated[
    HeadDtype, typer.Option("--draft-head-dtype", help="Storage dtype of the draft head.")
]
DeviceOpt = Annotated[Device, typer.Option("--device", help="Where the FP8 math runs.")]
CopyOpt = Annotated[bool, typer.Option("--copy", help="Copy untouched files instead of hard-linking them.")]
UpcastOpt = Annotated[
    bool,
    typer.Option(
        "--fp8-from-4bit",
        help="Convert a drafter already stored below 8 bits (NVFP4) to FP8 anyway: it gets larger.",
    ),
]
DraftWindowOpt = Annotated[
    int | None,
    typer.Option(
        "--draft-window",
        metavar="N",
        callback=_POSITIVE,
        help="Sliding window (tokens) of the drafter's attention, served by the plugin.",
    ),
]

# fix-exclusions
FixDestinationArg = Annotated[
    Path | None,
    typer.Argument(metavar="DST", help="Output directory (shards are hard-linked).", show_default=False),
]
InPlaceOpt = Annotated[
    bool, typer.Option("--in-place", help="Edit SRC's two JSON files (keeps .bak copies).")
]
CopyShardsOpt = Annotated[bool, typer.Option("--copy", help="Copy shards instead of hard-linking them.")]

# build-draft-vocab
CorpusOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--corpus",
        metavar="PATH",
        exists=True,
        help="Text/JSONL/Parquet file (.gz ok) or directory; repeatable.",
    ),
]
SizeOpt = Annotated[
    int, typer.Option("--size", metavar="K", callback=_POSITIVE, help="K: number of draft vocab ids.")
]
OutputOpt = Annotated[
    Path,
    typer.Option(
        "--output",
        "-o",
        metavar="IDS.pt",
        dir_okay=False,
        help="Ids file to write (+ OUTPUT.json sidecar).",
    ),
]
TextFieldOpt = Annotated[
    str,
    typer.Option("--text-field", metavar="FIELD", help="JSONL field / Parquet column with the text."),
]
MaxTokensOpt = Annotated[
    int | None,
    typer.Option("--max-tokens", metavar="N", callback=_POSITIVE, help="Stop after counting N tokens."),
]
EvalCorpusOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--eval-corpus",
        metavar="PATH",
        exists=True,
        help="Held-out corpus for coverage only; repeatable.",
    ),
]
BalanceTpOpt = Annotated[
    int | None,
    typer.Option(
        "--balance-tp", metavar="N", callback=_POSITIVE, help="Same number of ids in each of N vocab shards."
    ),
]
PlotOpt = Annotated[
    Path | None,
    typer.Option("--plot", metavar="PNG", dir_okay=False, help="Write the coverage curve as a PNG."),
]
GenerateOpt = Annotated[
    Path | None,
    typer.Option(
        "--generate",
        metavar="PROMPTS.jsonl",
        exists=True,
        dir_okay=False,
        help="Count what the model generates (in vLLM) for these prompts: one JSON object a line.",
    ),
]
EvalPromptsOpt = Annotated[
    Path | None,
    typer.Option(
        "--eval-prompts",
        metavar="PROMPTS.jsonl",
        exists=True,
        dir_okay=False,
        help="Held-out prompts: coverage of what the model generates for them.",
    ),
]
MaxNewTokensOpt = Annotated[
    int,
    typer.Option("--max-new-tokens", metavar="N", callback=_POSITIVE, help="Tokens generated per prompt."),
]
TemperatureOpt = Annotated[
    float,
    typer.Option(
        "--temperature", metavar="T", callback=_bounded(0), help="Sampling temperature (0 = greedy)."
    ),
]
TopPOpt = Annotated[
    float, typer.Option("--top-p", metavar="P", callback=_bounded(0, 1), help="Nucleus sampling.")
]
SeedOpt = Annotated[int, typer.Option("--seed", metavar="N", help="Sampling seed (prompt i uses N + i).")]
GeneratedWeightOpt = Annotated[
    float | None,
    typer.Option(
        "--generated-weight",
        metavar="W",
        help="Share (0 < W < 1) of generated text when mixed with --corpus; default 0.5.",
    ),
]

# set-draft-window
WindowArg = Annotated[
    int | None,
    typer.Argument(
        metavar="N",
        callback=_bounded(0),
        help="Window in tokens (below the model's max context); 0 removes it.",
        show_default=False,
    ),
]
ClearOpt = Annotated[bool, typer.Option("--clear", help="Remove the window: full draft attention.")]

# publish
VariantDirArg = Annotated[
    Path,
    typer.Argument(metavar="DIR", help="A -mtpfp8 variant written by quantize-mtp.", show_default=False),
]
RepoIdOpt = Annotated[
    str | None,
    typer.Option("--repo-id", metavar="USER/NAME", help="Default: <you>/<source name>-mtpfp8."),
]


def _hub_repo_id(value: str | None) -> str | None:
    """A usage error (exit 2, before anything is read) for a malformed Hub repo id."""
    if value is None:
        return None
    from mtpconv.commands.publish import repo_id_problem

    problem = repo_id_problem(value)
    if problem is not None:
        raise typer.BadParameter(f"{problem}.")
    return value


BaseModelOpt = Annotated[
    str | None,
    typer.Option(
        "--base-model",
        metavar="ID",
        callback=_hub_repo_id,
        help="Hub repo id of the source, for the card's base_model (a local source has none).",
    ),
]
PrivateOpt = Annotated[bool, typer.Option("--private", help="Create the repo private.")]
BranchOpt = Annotated[
    str | None,
    typer.Option("--revision", metavar="BRANCH", help="Branch to commit to (created if missing)."),
]
CreatePrOpt = Annotated[bool, typer.Option("--create-pr", help="Open a pull request instead of committing.")]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", metavar="TOKEN", help="Hub token (default: HF_TOKEN or your login)."),
]
CommitMessageOpt = Annotated[
    str | None,
    typer.Option("--commit-message", metavar="TEXT", help="Message of the upload commit."),
]
PublishDryRunOpt = Annotated[
    bool, typer.Option("--dry-run", help="List what would be uploaded; contact nothing.")
]
KeepCardOpt = Annotated[
    bool, typer.Option("--keep-card", help="Upload the directory's README.md as the card.")
]

# verify
FullOpt = Annotated[
    bool,
    typer.Option("--full", help="Also hash the files the manifest records without a sha256 (slow)."),
]

# eval
EvalVariantArg = Annotated[
    str,
    typer.Argument(
        metavar="VARIANT",
        help="The -mtpfp8 variant of SRC: a local directory or a Hub repo id.",
        show_default=False,
    ),
]
PromptsOpt = Annotated[
    Path | None,
    typer.Option(
        "--prompts",
        metavar="PROMPTS.jsonl",
        exists=True,
        dir_okay=False,
        help="Prompts, one JSON object a line (as for build-draft-vocab --generate); default built in.",
    ),
]
SpecTokensOpt = Annotated[
    int,
    typer.Option("-k", "--num-speculative-tokens", metavar="K", callback=_POSITIVE, help="Drafts per step."),
]
BatchOpt = Annotated[
    str, typer.Option("--batch", metavar="B[,B...]", help="Batch sizes to time, comma-separated.")
]
EvalMaxTokensOpt = Annotated[
    int, typer.Option("--max-tokens", metavar="N", callback=_POSITIVE, help="Tokens generated per prompt.")
]
RowsOpt = Annotated[
    str | None,
    typer.Option(
        "--rows",
        metavar="ROW[,ROW...]",
        help="Rows to serve: no-spec, source-mtp, variant-stock, variant-plugin (default all).",
    ),
]
EngineArgOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--engine-arg",
        metavar="KEY=VALUE",
        help="A keyword argument of vLLM's LLM for every row (JSON value), e.g. max_model_len=4096.",
    ),
]
NoSaveOpt = Annotated[
    bool, typer.Option("--no-save", help="Do not write mtpconv-eval.json into the variant directory.")
]
