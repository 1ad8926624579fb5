"""quantize-mtp's orchestration: device and head-dtype choices, and the plan's order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import mtpconv.commands.quantize_mtp as command
from fixtures.checkpoints import Spec, write_checkpoint
from mtpconv.commands.quantize_mtp import pick_device, quantize_mtp
from mtpconv.conversion_options import Device, HeadDtype
from mtpconv.plan import ConversionPlan, OutKind, OutTensor, ShardAction
from tests.helpers import raw_tensors

IDS = [0, 1, 2, 5, 17, 100, 200, 255]


def test_device_choices() -> None:
    assert [d.value for d in Device] == ["auto", "cpu", "cuda"]
    assert pick_device("cpu") == "cpu" == pick_device(Device.CPU)
    assert pick_device(Device.AUTO) == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="'gpu' is not a valid Device"):  # the CLI offers only choices
        pick_device("gpu")


def test_enum_values_print_and_serialize_as_their_strings() -> None:
    assert [h.value for h in HeadDtype] == ["fp8", "bf16"]
    for member in (Device.CUDA, HeadDtype.BF16, OutKind.FP8_SCALE, ShardAction.LINK):
        assert str(member) == f"{member}" == member.value
        assert json.dumps(member) == json.dumps(member.value)


def test_head_dtype_outside_the_enum_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "src", Spec(family="qwen3_5"))
    ids = tmp_path / "ids.pt"
    torch.save(torch.tensor(IDS, dtype=torch.int64), ids)
    with pytest.raises(ValueError, match="'fp16' is not a valid HeadDtype"):
        quantize_mtp(str(src), tmp_path / "v", draft_vocab=ids, draft_head_dtype="fp16", device=Device.CPU)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ids.pt", "src"]


def _detached_scales(tensors: list[OutTensor]) -> list[str]:
    """The scales in ``tensors`` that do not come right after their weight."""
    out = []
    for i, t in enumerate(tensors):
        if t.kind is OutKind.FP8_SCALE:
            assert t.linear is not None
            weight = t.linear.weight
        elif t.kind is OutKind.DRAFT_HEAD_SCALE:
            weight = t.spec.name.removesuffix("_scale")
        else:
            continue
        if i == 0 or tensors[i - 1].spec.name != weight:
            out.append(t.spec.name)
    return out


def _scales_first(tensors: list[OutTensor]) -> list[OutTensor]:
    scales = [t for t in tensors if t.kind in (OutKind.FP8_SCALE, OutKind.DRAFT_HEAD_SCALE)]
    return scales + [t for t in tensors if t not in scales]


def _reversed(tensors: list[OutTensor]) -> list[OutTensor]:
    return tensors[::-1]


@pytest.mark.parametrize("reorder", [_scales_first, _reversed])
@pytest.mark.parametrize(
    "spec",
    [
        Spec(family="qwen3_5_moe", quant="nvfp4", drafter_quant="nvfp4", vlm=True, shards=2),
        Spec(family="qwen3_5_moe", fused_experts=True),
    ],
)
def test_any_planned_order_writes_the_same_tensors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: Spec, reorder: object
) -> None:
    """A scale planned before its weight, or apart from it, still gets that weight's scale."""
    src = write_checkpoint(tmp_path / "src", spec)
    ids = tmp_path / "ids.pt"
    torch.save(torch.tensor(IDS, dtype=torch.int64), ids)
    quantize_mtp(str(src), tmp_path / "plain", draft_vocab=ids, device="cpu", fp8_from_4bit=True)

    real_build_plan = command.build_plan
    detached: list[str] = []

    def reordered_plan(*args: object, **kwargs: object) -> ConversionPlan:
        plan = real_build_plan(*args, **kwargs)
        for shard in plan.rewritten:
            assert _detached_scales(shard.tensors) == []  # as built: each scale after its weight
            shard.tensors = reorder(shard.tensors)  # type: ignore[operator]
            detached.extend(_detached_scales(shard.tensors))
        return plan

    monkeypatch.setattr(command, "build_plan", reordered_plan)
    quantize_mtp(str(src), tmp_path / "reordered", draft_vocab=ids, device="cpu", fp8_from_4bit=True)
    assert len(detached) > 2 and "mtp.draft_lm_head.weight_scale" in detached
    plain, reordered = raw_tensors(tmp_path / "plain"), raw_tensors(tmp_path / "reordered")
    assert reordered == plain
    assert "mtp.draft_lm_head.weight_scale" in reordered
    plain_m = json.loads((tmp_path / "plain" / "mtpconv.json").read_text())
    reordered_m = json.loads((tmp_path / "reordered" / "mtpconv.json").read_text())
    assert reordered_m["quantization_error"] == plain_m["quantization_error"]
