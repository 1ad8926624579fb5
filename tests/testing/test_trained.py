"""The trained tiny drafter (fixtures.trained): its grammar, and that the fast
configuration learns well above chance within a minute on this machine."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from fixtures.trained import (
    FAST,
    Grammar,
    TinyMtpModel,
    build_trained_model,
    grammar_text,
    load_checkpoint,
)


def test_grammar_has_structure() -> None:
    g = Grammar.make()
    rng = random.Random(1)
    sentences = [g.sentence(rng) for _ in range(300)]
    assert all(s.endswith(".") for s in sentences)
    # subject-verb agreement: "two/some/many" subjects never take a singular -s intransitive verb
    singular = {v + "s" for v in g.intransitive}
    for s in sentences:
        words = s.rstrip(".").split()
        if words[0] in ("two", "some", "many") and len(words) == 3:
            assert words[2] not in singular, s
    assert grammar_text(5, seed=3) == grammar_text(5, seed=3) != grammar_text(5, seed=4)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    return build_trained_model(tmp_path_factory.mktemp("trained"), FAST)


def test_fast_config_learns_above_chance(trained: tuple[Path, object]) -> None:
    _, report = trained
    assert report.seconds < 60  # type: ignore[attr-defined]
    base = report.unigram_baseline  # type: ignore[attr-defined]
    assert report.drafter_next_next_token_accuracy > max(0.15, 2 * base), report
    assert report.target_next_token_accuracy > 2 * base, report


def test_checkpoint_is_a_qwen3_5_mtp_model(trained: tuple[Path, object]) -> None:
    out, _ = trained
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForCausalLM"] and config["mtp_num_hidden_layers"] == 1
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("mtp.fc.weight").dtype == torch.bfloat16
    assert {"mtp.fc.weight", "mtp.layers.0.self_attn.q_proj.weight", "lm_head.weight"} <= names
    assert not any(n.startswith("model.layers.1.") for n in names)  # FAST has one layer
    # the stored weights read back into the reference model give the trained accuracy's model
    model = load_checkpoint(TinyMtpModel(FAST), out)
    assert model.mtp_fc.weight.shape == (FAST.hidden, 2 * FAST.hidden)
