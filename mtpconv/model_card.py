"""The ``README.md`` model card of a ``-mtpfp8`` variant.

Every number on the card comes from the variant itself: the manifest
(``mtpconv.json``) and the safetensors headers of the files it lists. Nothing is
estimated from a model name, and a fact that is not recorded (the license of a
local source, for instance) is stated as unknown rather than guessed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from huggingface_hub import ModelCardData
from huggingface_hub.repocard import metadata_load

from mtpconv import __version__
from mtpconv.checkpoint.safetensors_io import TensorInfo, read_header
from mtpconv.errors import ManifestError
from mtpconv.manifest import EVAL_REPORT_NAME, MANIFEST_NAME, Manifest
from mtpconv.quantconfig.standard import stock_vllm_since
from mtpconv.units import human_bytes

CARD_NAME = "README.md"
CARD_TAGS = ["mtp", "fp8", "speculative-decoding", "vllm"]
# vLLM is the engine that reads the variant's FP8 drafter (stock: the declared FP8; with the
# plugin: + the truncated head); a transformers label would advertise a path that ignores it.
LIBRARY_NAME = "vllm"
SPECULATIVE_CONFIG = '{"method":"mtp","num_speculative_tokens":2}'
INSTALL_COMMAND = 'pip install "mtpconv[vllm]"'
_LICENSE_FILES = ("LICENSE", "LICENSE.md", "LICENSE.txt", "LICENCE", "COPYING")


@dataclass(frozen=True)
class LicenseInfo:
    """The source's license as far as the variant records it."""

    license: str | None
    license_name: str | None = None
    license_link: str | None = None
    found_in: str | None = None  # "README.md", "mtpconv.json", "LICENSE", or None


def variant_tensors(directory: str | os.PathLike[str], manifest: Manifest) -> dict[str, TensorInfo]:
    """Every tensor of the variant, from the headers of the safetensors files it lists."""
    tensors: dict[str, TensorInfo] = {}
    for rel in manifest.variant_files:
        if rel.endswith(".safetensors"):
            tensors.update(read_header(Path(directory) / rel, file=rel).tensors)
    return tensors


def find_license(directory: str | os.PathLike[str], manifest: Manifest) -> LicenseInfo:
    """The source license: README front matter, then the manifest, then a LICENSE file."""
    directory = Path(directory)
    readme = directory / CARD_NAME
    if readme.is_file():
        try:
            meta = metadata_load(readme) or {}
        except Exception:  # a hand-written README with broken YAML carries no license
            meta = {}
        if isinstance(meta.get("license"), str):
            return LicenseInfo(
                meta["license"],
                _str_or_none(meta.get("license_name")),
                _str_or_none(meta.get("license_link")),
                CARD_NAME,
            )
    for key in ("license", "license_name"):
        value = manifest.source.get(key)
        if isinstance(value, str) and value:
            return LicenseInfo(
                _str_or_none(manifest.source.get("license")),
                _str_or_none(manifest.source.get("license_name")),
                _str_or_none(manifest.source.get("license_link")),
                MANIFEST_NAME,
            )
    for name in _LICENSE_FILES:
        if (directory / name).is_file():
            return LicenseInfo(None, None, name, name)
    return LicenseInfo(None)


def build_model_card(
    directory: str | os.PathLike[str], manifest: Manifest, repo_id: str, *, base_model: str | None = None
) -> str:
    """The full ``README.md`` text (YAML front matter + body) for ``repo_id``.

    ``base_model``: the source's Hub repo id where the manifest has none (a local source).
    """
    directory = Path(directory)
    source_repo = base_model or _str_or_none(manifest.source.get("repo_id"))
    lic = find_license(directory, manifest)
    tensors = variant_tensors(directory, manifest)

    data: dict[str, Any] = {"library_name": LIBRARY_NAME, "tags": list(CARD_TAGS)}
    if source_repo:
        data["base_model"] = source_repo
        data["base_model_relation"] = "quantized"
    if lic.license:
        data["license"] = lic.license
        if lic.license_name:
            data["license_name"] = lic.license_name
        if lic.license_link:
            data["license_link"] = _absolute_link(lic.license_link, directory, manifest)
    front = ModelCardData(**data).to_yaml()

    body = [
        f"# {repo_id.split('/')[-1]}",
        "",
        f"{_source_phrase(manifest, source_repo)} with its Multi-Token-Prediction (MTP) drafter converted "
        f"by [mtpconv](https://pypi.org/project/mtpconv/) {manifest.tool.get('version', '?')}. "
        "Only the drafter changed: every tensor outside it is byte-identical to the source, "
        "and draft tokens are still verified by the target model, so outputs are unchanged; "
        "drafting gets cheaper.",
        "",
        *_changes_section(manifest, tensors),
        *_error_section(manifest),
        *_vocab_section(manifest),
        *_window_section(manifest),
        *_eval_section(directory),
        "## Usage",
        "",
        "```bash",
        INSTALL_COMMAND,
        f"vllm serve {repo_id} --speculative-config '{SPECULATIVE_CONFIG}'",
        "```",
        "",
        *_engines_section(manifest, repo_id, source_repo),
        *_license_section(lic, source_repo),
    ]
    return f"---\n{front}\n---\n\n" + "\n".join(body).rstrip() + "\n"


def _changes_section(manifest: Manifest, tensors: dict[str, TensorInfo]) -> list[str]:
    linears = manifest.drafter.fp8_linears
    after = before = 0
    for name in linears:
        weight = tensors.get(f"{name}.weight")
        if weight is None:
            raise ManifestError(
                f"{MANIFEST_NAME} lists FP8 linear {name!r} but no tensor {name}.weight is in "
                "the variant's safetensors files; re-run `mtpconv quantize-mtp`."
            )
        scale = tensors.get(f"{name}.weight_scale")
        after += weight.nbytes + (scale.nbytes if scale else 0)
        before += weight.numel * 2
    lines = [
        "## What changed",
        "",
        f"- {len(linears)} drafter linears are FP8 e4m3 with per-tensor scales "
        f"(`{manifest.drafter.weight_scheme}` weights, `{manifest.drafter.activation_scheme}` "
        "activation scales).",
        "",
        "| read per draft step | before | after |",
        "|---|---|---|",
        f"| {len(linears)} drafter linears | {human_bytes(before)} if BF16 ¹ "
        f"| {human_bytes(after)} (FP8 + scales) |",
    ]
    dv = manifest.draft_vocab
    if dv is not None:
        head = tensors.get(dv.head_tensor)
        if head is None:
            raise ManifestError(
                f"{MANIFEST_NAME} names draft head {dv.head_tensor!r}, which is not in the "
                "variant's safetensors files; re-run `mtpconv build-draft-vocab`."
            )
        scale = tensors.get(f"{dv.head_tensor}_scale")
        head_after = head.nbytes + (scale.nbytes if scale else 0)
        full = _full_lm_head(tensors, manifest.drafter.prefix)
        full_cell = (
            f"{human_bytes(full[1].nbytes)} (`{full[0]}` {list(full[1].shape)}, {full[1].dtype})"
            if full
            else "not found in the variant"
        )
        lines.append(
            f"| LM head used by the drafter | {full_cell} | {human_bytes(head_after)} "
            f"(`{dv.head_tensor}` {list(head.shape)}, {dv.head_dtype}) |"
        )
    lines += [
        "",
        "¹ The same weights at 2 bytes each; `mtpconv.json` does not record the source's "
        "storage dtype. Every other figure is read from this variant's safetensors headers.",
        "",
    ]
    return lines


def _error_section(manifest: Manifest) -> list[str]:
    errs = {k: v for k, v in manifest.quantization_error.items() if isinstance(v, dict)}
    rel = {k: float(v["rel_l2"]) for k, v in errs.items() if "rel_l2" in v}
    mab = {k: float(v["max_abs"]) for k, v in errs.items() if "max_abs" in v}
    lines = ["## FP8 quantization error", ""]
    if not rel and not mab:
        return [*lines, "Not recorded in `mtpconv.json`.", ""]
    lines += ["| statistic | value | tensor |", "|---|---|---|"]
    if rel:
        worst = max(rel, key=lambda k: rel[k])
        lines.append(f"| max relative L2 error | {rel[worst]:.3e} | `{worst}` |")
        lines.append(
            f"| mean relative L2 error | {sum(rel.values()) / len(rel):.3e} | over {len(rel)} tensors |"
        )
    if mab:
        worst = max(mab, key=lambda k: mab[k])
        lines.append(f"| max absolute error | {mab[worst]:.3e} | `{worst}` |")
    return [*lines, "", "Per-tensor figures are in `mtpconv.json` (`quantization_error`).", ""]


_GENERATED_KEYS = ("generated", "eval_generated")


def _generated_lines(corpus: dict[str, Any]) -> list[str]:
    """Coverage of the text the model itself generates, where the sidecar recorded it."""
    lines = []
    made, held = corpus.get("generated"), corpus.get("eval_generated")
    if isinstance(made, dict) and isinstance(made.get("coverage"), int | float):
        lines.append(
            f"- Coverage of text the model generates: {100 * made['coverage']:.2f}% "
            f"({_plain(made.get('tokens'))} tokens generated for {_plain(made.get('prompts'))} prompts)."
        )
    if isinstance(held, dict) and isinstance(held.get("coverage"), int | float):
        lines.append(
            f"- Coverage of text the model generates for held-out prompts: {100 * held['coverage']:.2f}% "
            f"({_plain(held.get('tokens'))} tokens)."
        )
    return lines


def _vocab_section(manifest: Manifest) -> list[str]:
    dv = manifest.draft_vocab
    lines = ["## Draft vocabulary", ""]
    if dv is None:
        return [*lines, "None: the drafter scores the full vocabulary.", ""]
    lines.append(f"- {dv.size:,} token ids (`{dv.file}`), head `{dv.head_tensor}` in {dv.head_dtype}.")
    if dv.coverage is not None:
        lines.append(f"- Coverage of the corpus: {100 * dv.coverage:.2f}%.")
    lines += _generated_lines(dv.corpus or {})
    # Generated text (build-draft-vocab --generate) has its own lines above.
    counted = {k: v for k, v in (dv.corpus or {}).items() if k not in _GENERATED_KEYS}
    if counted:
        desc = ", ".join(f"{k}: {_plain(v)}" for k, v in counted.items())
        lines.append(f"- Corpus: {desc}.")
    else:
        lines.append("- Corpus: not recorded.")
    return [
        *lines,
        "",
        "Draft ids outside this set are never proposed; verification by the "
        "target still covers the full vocabulary.",
        "",
    ]


def _window_section(manifest: Manifest) -> list[str]:
    """Only for a variant with a draft window: without one the card is what it always was."""
    if manifest.draft_window is None:
        return []
    return [
        "## Draft attention window",
        "",
        f"The mtpconv plugin builds the drafter's attention with a sliding window of "
        f"{manifest.draft_window:,} tokens (`draft_window` in `mtpconv.json`); the target's "
        "attention is full. Outputs are unchanged, since the target verifies every draft "
        "token; acceptance can be lower at contexts longer than the window.",
        "",
    ]


def _engines_section(manifest: Manifest, repo_id: str, source_repo: str | None) -> list[str]:
    """What each engine gets from this variant, claiming only what is verified (README)."""
    d = manifest.drafter
    older: list[str] = []
    if d.declaration == "standard":
        algos = ", ".join(sorted(set(d.declared_algorithms.values()))) or "its FP8 config group"
        since = stock_vllm_since(d.declared_algorithms.values())
        if since is not None:
            older = [
                f"| stock vLLM < {since} (no plugin) | refuses this variant at load: its ModelOpt "
                f"MIXED_PRECISION config builds no layer of these algorithms ({algos}), so the FP8 "
                "scales find no parameter (measured on 0.26) |"
            ]
        stock = (
            f"the FP8 drafter through its own quant config ({algos}) and the full target head "
            "(it never loads `mtpconv/draft_head.safetensors`)"
        )
    else:
        stock = (
            "refuses this variant loudly at load: the drafter is excluded from the quant config "
            "while stored FP8; use the plugin"
        )
    if d.kept_bf16:
        stock += "; " + ", ".join(f"`{m}`" for m in sorted(d.kept_bf16)) + " stay BF16 (plain `nn.Linear`)"
    plugin = "the FP8 drafter on the plugin's kernels"
    dv = manifest.draft_vocab
    plugin += (
        f" + the truncated {dv.size:,}-row draft head" if dv is not None else " (no truncated head here)"
    )
    lines = [
        "## Engines",
        "",
        "| engine | what it gets |",
        "|---|---|",
        f"| stock vLLM >= 0.32 (no plugin) | {stock} |",
        *older,
        f"| vLLM + mtpconv plugin | {plugin} |",
    ]
    sglang = "the ids file as `--speculative-token-map` with the *source* checkpoint; not this drafter"
    lines += [
        f"| SGLang | {sglang if dv is not None else 'nothing (this variant has no draft vocabulary)'} |",
        "",
        "Stock vLLM serves this checkpoint correctly or refuses it loudly, never silently wrong.",
        "",
        "SGLang was not run. From its source (`python/sglang/srt/models/qwen3_5_mtp.py`), its Qwen3.5 "
        "MTP class builds `fc` as a plain `nn.Linear` (the whole drafter unquantized under a ModelOpt "
        "MIXED_PRECISION config) and skips `weight_scale` tensors: it would read this variant's FP8 "
        "drafter without its scales. Its output would still be right (the target verifies every "
        "draft), its drafts would not.",
        "",
    ]
    if dv is None:
        return lines
    base = source_repo or "<the source checkpoint>"
    return [
        *lines,
        f"`{dv.file}` is SGLang's token-map format (verified by mtpconv's tests: SGLang's load "
        "path, `torch.load(..., weights_only=True)` then an int64 tensor, gives exactly these "
        "ids); SGLang slices the target's head to them and maps drafted ids back:",
        "",
        "```bash",
        f"python -m sglang.launch_server --model-path {base} --speculative-algorithm NEXTN \\",
        f"  --speculative-token-map {repo_id}/{dv.file}",
        "```",
        "",
    ]


def read_eval_report(directory: Path) -> dict[str, Any] | None:
    """``mtpconv-eval.json`` of ``directory`` (written by ``mtpconv eval``), or None without one."""
    path = directory / EVAL_REPORT_NAME
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        rows = doc["rows"]
        if not isinstance(rows, list):
            raise TypeError("rows is not a list")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ManifestError(
            f"{path} is not a report of `mtpconv eval` ({exc}); run it again or remove the file."
        ) from exc
    return dict(doc)


def _cell(value: Any, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _eval_section(directory: Path) -> list[str]:
    """The measured rows of ``mtpconv eval``, with the vLLM version, GPU and command that made them."""
    doc = read_eval_report(directory)
    if doc is None:
        return []
    lines = [
        "## Measured in vLLM",
        "",
        f"`{doc.get('command', 'mtpconv eval')}` with vLLM {doc.get('vllm_version', '?')} on "
        f"{doc.get('device', '?')}: k = {doc.get('num_speculative_tokens', '?')}, greedy, "
        f"{doc.get('max_tokens', '?')} tokens a prompt, prompts {doc.get('prompts', '?')}. Each row ran in "
        "a fresh process; acceptance counts the tokens the requests received.",
        "",
        "| row | batch | same output as no speculation | accepted / drafted | mean accepted length "
        "| decode tok/s | vs source MTP |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in doc["rows"]:
        if row.get("error"):
            lines.append(f"| {row['row']} | - | failed: {row['error']} | | | | |")
            continue
        for b in row.get("batches", []):
            same = {True: "yes", False: "no", None: "-"}[b.get("identical_to_no_spec")]
            drafted = f"{b['accepted']} / {b['draft_tokens']}" if b.get("draft_tokens") else "-"
            speed = b.get("decode_tokens_per_second") or b.get("output_tokens_per_second")
            lines.append(
                f"| {row['row']} | {b['batch']} | {same} | {drafted} "
                f"| {_cell(b.get('served_mean_acceptance_length'), 2)} | {_cell(speed, 1)} "
                f"| {_cell(b.get('speedup_vs_source_mtp'), 2)} |"
            )
    return [*lines, ""]


def _license_section(lic: LicenseInfo, source_repo: str | None) -> list[str]:
    lines = ["## Source and license", ""]
    if source_repo:
        lines.append(f"- Source: [{source_repo}](https://huggingface.co/{source_repo}).")
    else:
        lines.append(
            "- Source: a local checkpoint; its base model on the Hub is unknown (none was named "
            "when it was published)."
        )
    if lic.license and lic.found_in:
        name = f" ({lic.license_name})" if lic.license_name else ""
        lines.append(
            f"- License: `{lic.license}`{name}, carried over from the source's "
            f"`{lic.found_in}`. The source's terms apply to this variant."
        )
    elif lic.found_in:
        lines.append(
            f"- License: see `{lic.found_in}`, copied from the source. The source's "
            "terms apply to this variant."
        )
    else:
        lines.append(
            "- License: unknown (the source's license is not recorded in this "
            "variant). Check the source's terms before use."
        )
    lines.append(
        f"- `{MANIFEST_NAME}` records the source and the sha256 of every file; "
        f"card generated by mtpconv {__version__}."
    )
    return lines


def _full_lm_head(tensors: dict[str, TensorInfo], prefix: str) -> tuple[str, TensorInfo] | None:
    for name in sorted(tensors):
        if (name == "lm_head.weight" or name.endswith(".lm_head.weight")) and not (
            prefix and name.startswith(prefix)
        ):
            return name, tensors[name]
    return None


def _absolute_link(link: str, directory: Path, manifest: Manifest) -> str:
    """A relative license link stays valid only if the file travels with the variant."""
    if "://" in link or (directory / link).is_file():
        return link
    repo = manifest.source.get("repo_id")
    if not repo:
        return link
    rev = manifest.source.get("revision") or "main"
    return f"https://huggingface.co/{repo}/blob/{rev}/{PurePosixPath(link)}"


def _source_phrase(manifest: Manifest, repo: str | None) -> str:
    if repo:
        return f"[{repo}](https://huggingface.co/{repo})"
    path = manifest.source.get("path")
    name = PurePosixPath(str(path).replace("\\", "/")).name if path else "a local checkpoint"
    return f"The local checkpoint `{name}`"


def _plain(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, float | str):
        return str(value)
    return json.dumps(value, sort_keys=True)


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
