"""DeepSeek-V4's vLLM name rule against vLLM's own loader functions (needs vLLM).

`families.vllm_drafter_key` says DeepSeek-V4's ``mtp.{i}.X`` is ``model.layers.{N + i}.X`` in the
quant config. vLLM's ``DeepSeekV4MTP`` gets there in two steps: ``_to_spec_layer_name`` /
``_rewrite_spec_layer_name`` give the parameter path ``model.layers.{N + i}[.mtp_block].X``, and
its decoder layer is built with the layer's own prefix (``DeepseekV4DecoderLayer(vllm_config,
prefix)``), so the quant config sees the path without ``mtp_block``. Fed every drafter tensor
of a converted variant, vLLM's functions must land on the rule's name for each FP8 linear.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.family_checkpoints import LAYERS, write_family_checkpoint
from fixtures.vllm_stub import run_with_vllm
from mtpconv.commands.quantize_mtp import quantize_mtp
from mtpconv.families import vllm_drafter_key
from tests.helpers import raw_tensors

_NAMES = r"""
import json, sys, types
from vllm.models.deepseek_v4.nvidia import mtp
n_layers, names = json.load(sys.stdin)
me = types.SimpleNamespace(config=types.SimpleNamespace(num_hidden_layers=n_layers, num_nextn_predict_layers=1))
out = {}
for name in names:
    spec = mtp.DeepSeekV4MTP._to_spec_layer_name(me, name)
    layer = mtp.get_spec_layer_idx_from_weight_name(me.config, spec)
    out[name] = None if layer is None else mtp.DeepSeekV4MTP._rewrite_spec_layer_name(me, layer, spec)
json.dump(out, sys.stdout)
"""


@pytest.mark.vllm
def test_vllm_names_each_deepseek_v4_drafter_linear_as_the_declaration_does(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    src = write_family_checkpoint(tmp_path / "src", "deepseek_v4")
    report = quantize_mtp(str(src), tmp_path / "dst", device="cpu")
    names = sorted(n for n in raw_tensors(tmp_path / "dst") if n.startswith("mtp."))
    params = run_with_vllm(_NAMES, [LAYERS, names], timeout=600)
    assert all(params.values()), [n for n, p in params.items() if p is None]  # vLLM reads them all
    assert report.plan.linears
    for lin in report.plan.linears:
        param = params[lin.fp8_weight_name]
        assert (
            params[lin.fp8_scale_name] == param.removesuffix("weight") + lin.fp8_scale_name.rsplit(".", 1)[1]
        )
        # the decoder block's quant-config prefix has no mtp_block; load_weights renames shared w2
        seen = param.removesuffix(".weight").replace(".mtp_block.", ".")
        seen = seen.replace(".shared_experts.w2", ".shared_experts.down_proj")
        assert seen == vllm_drafter_key(lin.module, "deepseek_v4", LAYERS), lin.module
        assert not lin.fp8_scale_name.endswith(".scale")  # vLLM would rename it weight_scale_inv
