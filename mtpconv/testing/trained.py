"""A tiny Qwen3.5 model whose MTP drafter is really trained, on text from a small grammar.

Planted drafters (mtpconv.testing.planted) are right by construction; this one has
learned, so its acceptance is a measurement. :func:`grammar_text` writes sentences of
a probabilistic grammar (agreement of number between subject and verb, adjectives
that prefer their nouns, Zipf-distributed words, prepositional phrases), so the
next token is predictable in part and the one after it less so. :func:`train`
fits the target (dense Qwen3.5 layout, every layer ``full_attention``) and its
MTP block together: the target on the next token, the drafter on the token after
it from the target's final hidden state and the next token's embedding, the way
vLLM's ``Qwen3_5MTP`` calls it. The math here follows vLLM 0.32's modules
(``qwen3_next.py``): ``1 + w`` RMS norms, a gated ``q_proj`` (query and gate per
head), q/k norms, partial NeoX rotary, SiLU-gated MLP; the checkpoint uses the
tensor names of mtpconv.testing.planted (family ``qwen3_5``), so vLLM and
quantize-mtp load it.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from mtpconv.testing.planted import TinySpec, _config
from mtpconv.testing.tokenizers import write_tiny_tokenizer

EOS = "<|im_end|>"
_SYL = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "do", "gu", "be", "fi")


def _words(rng: random.Random, n: int, used: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        w = "".join(rng.choice(_SYL) for _ in range(rng.randint(2, 3)))
        if w not in used:
            used.add(w)
            out.append(w)
    return out


@dataclass(frozen=True)
class Grammar:
    """The lexicon of the grammar (fixed by its seed) and its sentence sampler."""

    nouns: list[str]
    adjectives: list[str]
    transitive: list[str]
    intransitive: list[str]

    @classmethod
    def make(cls, seed: int = 0) -> Grammar:
        rng = random.Random(seed)
        used: set[str] = set()
        return cls(
            _words(rng, 120, used), _words(rng, 40, used), _words(rng, 40, used), _words(rng, 16, used)
        )

    def _zipf(self, rng: random.Random, words: list[str]) -> str:
        weights = [1.0 / (r + 1) for r in range(len(words))]
        return rng.choices(words, weights=weights)[0]

    def _np(self, rng: random.Random, plural: bool, depth: int = 0) -> list[str]:
        noun_i = self.nouns.index(self._zipf(rng, self.nouns))
        det = rng.choice(("the", "some", "two", "many") if plural else ("the", "a", "every", "this"))
        words = [det]
        if rng.random() < 0.4:  # each noun prefers two adjectives: a learnable collocation
            pick = (
                noun_i % len(self.adjectives) if rng.random() < 0.7 else rng.randrange(len(self.adjectives))
            )
            words.append(self.adjectives[pick])
        words.append(self.nouns[noun_i] + ("s" if plural else ""))
        if depth == 0 and rng.random() < 0.25:
            words += [rng.choice(("in", "near", "under", "with")), *self._np(rng, rng.random() < 0.3, 1)]
        return words

    def _clause(self, rng: random.Random) -> list[str]:
        plural = rng.random() < 0.4
        subject = self._np(rng, plural)
        if rng.random() < 0.3:
            return [*subject, self._zipf(rng, self.intransitive) + ("" if plural else "s")]
        verb = self._zipf(rng, self.transitive) + ("" if plural else "s")
        return [*subject, verb, *self._np(rng, rng.random() < 0.4)]

    def sentence(self, rng: random.Random) -> str:
        words = self._clause(rng)
        if rng.random() < 0.3:
            words += [",", rng.choice(("and", "because", "while")), *self._clause(rng)]
        return " ".join(words).replace(" ,", ",") + "."


def grammar_text(n_lines: int, *, seed: int, grammar: Grammar | None = None) -> list[str]:
    """``n_lines`` documents of 2-5 grammar sentences; another seed gives held-out text."""
    g = grammar or Grammar.make()
    rng = random.Random(seed)
    return [" ".join(g.sentence(rng) for _ in range(rng.randint(2, 5))) for _ in range(n_lines)]


@dataclass(frozen=True)
class TrainConfig:
    """Model size and training budget; :data:`FAST` is the test's."""

    hidden: int = 128
    intermediate: int = 256
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    vocab: int = 512
    seq_len: int = 96
    batch: int = 24
    steps: int = 1200
    lr: float = 3e-3
    train_lines: int = 12000
    seconds: float = 540.0  # stop early at this wall time (2 shared cores)
    seed: int = 0
    threads: int = 1  # on a shared 2-core machine one thread was 4x faster than two


FAST = TrainConfig(
    hidden=64, intermediate=128, layers=1, seq_len=64, batch=16, steps=300, train_lines=1500, seconds=45.0
)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """vLLM's GemmaRMSNorm (Qwen3NextRMSNorm): ``x / rms(x) * (1 + w)``."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w.float())).to(x.dtype)


class _Layer(nn.Module):
    """One full-attention Qwen3.5 decoder layer (dense MLP)."""

    def __init__(self, c: TrainConfig) -> None:
        super().__init__()
        h, d = c.hidden, c.head_dim
        self.c = c
        self.q_proj = nn.Linear(h, 2 * c.heads * d, bias=False)
        self.k_proj = nn.Linear(h, c.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, c.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(c.heads * d, h, bias=False)
        self.q_norm = nn.Parameter(torch.zeros(d))
        self.k_norm = nn.Parameter(torch.zeros(d))
        self.input_layernorm = nn.Parameter(torch.zeros(h))
        self.post_attention_layernorm = nn.Parameter(torch.zeros(h))
        self.gate_proj = nn.Linear(h, c.intermediate, bias=False)
        self.up_proj = nn.Linear(h, c.intermediate, bias=False)
        self.down_proj = nn.Linear(c.intermediate, h, bias=False)

    def _rope(self, x: torch.Tensor) -> torch.Tensor:
        """NeoX rotary on the first quarter of each head (partial_rotary_factor 0.25)."""
        t, rot = x.shape[-2], self.c.head_dim // 4
        inv = 1.0 / (10000.0 ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
        ang = torch.arange(t, dtype=torch.float32)[:, None] * inv[None, :]
        cos, sin = ang.cos(), ang.sin()
        x1, x2, rest = x[..., : rot // 2], x[..., rot // 2 : rot], x[..., rot:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.c
        b, t, _ = x.shape
        h = _rms(x, self.input_layernorm)
        qg = self.q_proj(h).view(b, t, c.heads, 2 * c.head_dim)
        q, gate = qg.chunk(2, dim=-1)  # per head: query then gate (vLLM's split)
        k = self.k_proj(h).view(b, t, c.kv_heads, c.head_dim)
        v = self.v_proj(h).view(b, t, c.kv_heads, c.head_dim)
        q = self._rope(_rms(q, self.q_norm).transpose(1, 2))
        k = self._rope(_rms(k, self.k_norm).transpose(1, 2))
        att = F.scaled_dot_product_attention(
            q, k, v.transpose(1, 2), is_causal=True, enable_gqa=True
        ).transpose(1, 2)
        att = att * torch.sigmoid(gate)
        x = x + self.o_proj(att.reshape(b, t, c.heads * c.head_dim))
        h = _rms(x, self.post_attention_layernorm)
        out: torch.Tensor = x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))
        return out


class TinyMtpModel(nn.Module):
    """Target (embed, layers, norm, head) and its one-layer MTP drafter."""

    def __init__(self, c: TrainConfig) -> None:
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.hidden)
        self.layers = nn.ModuleList(_Layer(c) for _ in range(c.layers))
        self.norm = nn.Parameter(torch.zeros(c.hidden))
        self.lm_head = nn.Linear(c.hidden, c.vocab, bias=False)
        self.mtp_fc = nn.Linear(2 * c.hidden, c.hidden, bias=False)
        self.mtp_norm_embedding = nn.Parameter(torch.zeros(c.hidden))
        self.mtp_norm_hidden = nn.Parameter(torch.zeros(c.hidden))
        self.mtp_layer = _Layer(c)
        self.mtp_norm = nn.Parameter(torch.zeros(c.hidden))
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        nn.init.normal_(self.embed.weight, std=1.0)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits of the next token at each position, and the drafter's of the one after."""
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        hidden = _rms(x, self.norm)  # what vLLM hands the drafter: the normed final state
        # Drafter at position i: hidden h_i and the embedding of token i+1 -> token i+2.
        emb = _rms(self.embed(ids[:, 1:]), self.mtp_norm_embedding)
        d = self.mtp_fc(torch.cat([emb, _rms(hidden[:, :-1], self.mtp_norm_hidden)], dim=-1))
        d = _rms(self.mtp_layer(d), self.mtp_norm)
        return self.lm_head(hidden), self.lm_head(d)


def _encode(tokenizer: object, lines: list[str], eos: int) -> torch.Tensor:
    ids: list[int] = []
    for enc in tokenizer.encode_batch(lines, add_special_tokens=False):  # type: ignore[attr-defined]
        ids += [*enc.ids, eos]
    return torch.tensor(ids, dtype=torch.long)


def _batches(stream: torch.Tensor, c: TrainConfig, g: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, stream.numel() - c.seq_len - 1, (c.batch,), generator=g)
    return torch.stack([stream[s : s + c.seq_len] for s in starts.tolist()])


def _losses(model: TinyMtpModel, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits, draft = model(ids)
    v = model.c.vocab
    target = F.cross_entropy(logits[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1))
    drafter = F.cross_entropy(draft[:, :-1].reshape(-1, v), ids[:, 2:].reshape(-1))
    return target, drafter


@dataclass
class TrainReport:
    """What training reached, measured on held-out grammar text."""

    steps: int
    seconds: float
    target_next_token_accuracy: float
    drafter_next_next_token_accuracy: float
    drafter_agrees_with_target: float  # drafter's t+2 == target's greedy t+2 given t+1
    unigram_baseline: float  # always the most frequent token: the bar "above chance" clears
    held_out_tokens: int


@torch.no_grad()
def greedy(model: TinyMtpModel, prompt: list[int], n: int) -> list[int]:
    """The target's greedy continuation of ``prompt`` (the reference vLLM must reproduce)."""
    ids = list(prompt)
    for _ in range(n):
        logits, _ = model(torch.tensor([ids]))
        ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt) :]


@torch.no_grad()
def evaluate(model: TinyMtpModel, stream: torch.Tensor, seq_len: int) -> tuple[float, float, float, int]:
    """(target accuracy, drafter next-next accuracy, drafter/target agreement, tokens scored)."""
    model.eval()
    n = (stream.numel() // seq_len) * seq_len
    ids = stream[:n].view(-1, seq_len)
    logits, draft = model(ids)
    nxt = logits.argmax(-1)
    d = draft.argmax(-1)[:, :-1]
    target_acc = (nxt[:, :-1] == ids[:, 1:]).float().mean().item()
    draft_acc = (d == ids[:, 2:]).float().mean().item()
    agree = (d == nxt[:, 1:-1]).float().mean().item()  # target's own prediction of t+2
    model.train()
    return target_acc, draft_acc, agree, int(d.numel())


def train(c: TrainConfig, tokenizer: object, eos: int, log: bool = False) -> tuple[TinyMtpModel, TrainReport]:
    """Train target and drafter together on grammar text; evaluate on held-out text."""
    torch.manual_seed(c.seed)
    torch.set_num_threads(c.threads)
    grammar = Grammar.make()
    stream = _encode(tokenizer, grammar_text(c.train_lines, seed=c.seed + 1, grammar=grammar), eos)
    held = _encode(tokenizer, grammar_text(300, seed=c.seed + 2, grammar=grammar), eos)
    model = TinyMtpModel(c)
    opt = torch.optim.AdamW(model.parameters(), lr=c.lr, weight_decay=0.01, betas=(0.9, 0.98))
    g = torch.Generator().manual_seed(c.seed)
    start = time.perf_counter()
    step = 0
    while step < c.steps:
        done = max(step / c.steps, (time.perf_counter() - start) / c.seconds)
        if done >= 1.0:
            break
        warm = min(1.0, (step + 1) / 30)
        for group in opt.param_groups:
            group["lr"] = c.lr * warm * 0.5 * (1 + math.cos(math.pi * done))
        target, drafter = _losses(model, _batches(stream, c, g))
        opt.zero_grad(set_to_none=True)
        (target + drafter).backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if log and step % 100 == 0:
            print(f"step {step}: target {target.item():.3f} drafter {drafter.item():.3f}", flush=True)
    seconds = time.perf_counter() - start
    t_acc, d_acc, agree, n = evaluate(model, held, c.seq_len)
    counts = torch.bincount(held, minlength=c.vocab)
    baseline = counts.max().item() / held.numel()
    return model, TrainReport(step, seconds, t_acc, d_acc, agree, baseline, n)


def _layer_tensors(p: str, layer: _Layer) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {
        f"{p}input_layernorm.weight": layer.input_layernorm,
        f"{p}post_attention_layernorm.weight": layer.post_attention_layernorm,
        f"{p}self_attn.q_norm.weight": layer.q_norm,
        f"{p}self_attn.k_norm.weight": layer.k_norm,
    }
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        out[f"{p}self_attn.{name}.weight"] = getattr(layer, name).weight
    for name in ("gate_proj", "up_proj", "down_proj"):
        out[f"{p}mlp.{name}.weight"] = getattr(layer, name).weight
    return out


def checkpoint_tensors(model: TinyMtpModel) -> dict[str, torch.Tensor]:
    """The model under the Qwen3.5 names of mtpconv.testing.planted, in bf16."""
    return {k: v.detach().to(torch.bfloat16).contiguous() for k, v in _named(model).items()}


def load_checkpoint(model: TinyMtpModel, directory: str | Path) -> TinyMtpModel:
    """Read a checkpoint written by :func:`build_trained_model` back into ``model`` (a reference)."""
    from safetensors.torch import load_file

    stored = load_file(str(Path(directory) / "model.safetensors"))
    with torch.no_grad():
        for name, param in _named(model).items():
            param.copy_(stored[name].float())
    return model


def _named(model: TinyMtpModel) -> dict[str, torch.Tensor]:
    t: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": model.embed.weight,
        "model.norm.weight": model.norm,
        "lm_head.weight": model.lm_head.weight,
        "mtp.fc.weight": model.mtp_fc.weight,
        "mtp.pre_fc_norm_embedding.weight": model.mtp_norm_embedding,
        "mtp.pre_fc_norm_hidden.weight": model.mtp_norm_hidden,
        "mtp.norm.weight": model.mtp_norm,
    }
    for i, layer in enumerate(model.layers):
        assert isinstance(layer, _Layer)
        t |= _layer_tensors(f"model.layers.{i}.", layer)
    assert isinstance(model.mtp_layer, _Layer)
    t |= _layer_tensors("mtp.layers.0.", model.mtp_layer)
    return t


def build_trained_model(
    dst: str | Path, c: TrainConfig = TrainConfig(), *, log: bool = False
) -> tuple[Path, TrainReport]:
    """Train and write a checkpoint directory vLLM serves with ``method="mtp"``."""
    from tokenizers import Tokenizer

    out = Path(dst)
    out.mkdir(parents=True, exist_ok=True)
    write_tiny_tokenizer(out, c.vocab, eos_token=EOS, texts=grammar_text(3000, seed=c.seed))
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    eos = tokenizer.token_to_id(EOS)
    if eos is None:
        raise ValueError(f"{out / 'tokenizer.json'} has no {EOS} token")
    model, report = train(c, tokenizer, eos, log=log)
    save_file(checkpoint_tensors(model), str(out / "model.safetensors"), metadata={"format": "pt"})
    spec = TinySpec(
        vocab=c.vocab,
        hidden=c.hidden,
        intermediate=c.intermediate,
        layers=c.layers,
        heads=c.heads,
        kv_heads=c.kv_heads,
        head_dim=c.head_dim,
    )
    config = _config(spec) | {"eos_token_id": eos}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}) + "\n")
    (out / "train_report.json").write_text(json.dumps(report.__dict__, indent=2) + "\n")
    return out, report
