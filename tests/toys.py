"""A scorer and a model family of the kind a researcher adds: each one class, registered for
the length of a test (conftest's ``toy_registries`` fixture) and nowhere else, so that the
commands are checked to work with what the registries hold, not with the shipped names.

``ToyFamily`` has what a family needs (``nmt.models.base``) and nothing else: no
``typical_matmuls`` and no ``forward_flops``, no Transformer or RNN option names."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from torch import Tensor, nn

from nmt.attention import Scorer, build_scorer
from nmt.data.tokenizer import PAD
from nmt.models.base import Beams, beam_rows, beams_as_queries


class ToyScorer(Scorer):
    """Cosine similarity with a learned temperature: e = exp(tau) cos(q, k)."""

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int):
        super().__init__(query_dim, key_dim, hidden_dim)
        self.log_temperature = nn.Parameter(torch.tensor(2.0))

    def prepare_keys(self, keys: Tensor) -> Tensor:
        return F.normalize(keys, dim=-1)  # (..., S, Dk)

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        return self.log_temperature.exp() * F.normalize(query, dim=-1) @ keys.transpose(-1, -2)

    def score_flops(self, t: int, s: int) -> int:
        return 2 * t * s * self.query_dim


class ToyFamily(nn.Module):
    """Bag of embeddings (+ positions) as the encoder; a GRU cell that attends over them."""

    def __init__(self, vocab_size: int, attention: str = "toy_cosine", emb_dim: int = 16,
                 dropout: float = 0.0, max_positions: int = 128):
        super().__init__()
        self.max_positions, self.p = max_positions, dropout
        self.embed = nn.Embedding(vocab_size, emb_dim, padding_idx=PAD)
        self.positions = nn.Embedding(max_positions, emb_dim)
        self.scorer = build_scorer(attention, emb_dim, emb_dim, emb_dim)
        self.cell = nn.GRUCell(2 * emb_dim, emb_dim)
        self.out = nn.Linear(2 * emb_dim, vocab_size)

    def set_dropout(self, p: float) -> None:
        self.p = p

    def encode(self, src: Tensor, src_mask: Tensor) -> dict[str, Tensor]:
        words = self.embed(src) + self.positions(torch.arange(src.size(1), device=src.device))
        words = F.dropout(words, self.p, self.training)  # (B, S, E)
        mean = (words * src_mask.unsqueeze(-1)).sum(1) / src_mask.sum(1, keepdim=True)  # (B, E)
        return {"words": words, "keys": self.scorer.prepare_keys(words),
                "mask": src_mask.unsqueeze(1), "init": torch.tanh(mean)}

    def init_state(self, memory: dict[str, Tensor]) -> Tensor:
        return memory["init"]

    def decode_step(self, prev: Tensor, state: Tensor, memory: dict[str, Tensor],
                    need_attn: bool = False, beams: Beams | None = None):
        n = memory["mask"].size(0)
        context, attn = self.scorer.attend(beams_as_queries(state.unsqueeze(1), n, beams),
                                           memory["keys"], memory["words"], memory["mask"],
                                           need_weights=need_attn)  # (n, K, E), (n, K, S)
        context = beam_rows(context.flatten(0, 1), beams)  # (B, E)
        state = self.cell(torch.cat([self.embed(prev), context], -1), state)
        logits = self.out(torch.cat([state, context], -1))  # (B, V)
        attn = beam_rows(attn.flatten(0, 1), beams) if attn is not None else None
        return torch.log_softmax(logits, -1, dtype=torch.float32), state, attn

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor:
        memory = self.encode(src, src_mask)
        state, steps = self.init_state(memory), []
        for prev in tgt_in.unbind(1):  # T x (B,)
            log_probs, state, _ = self.decode_step(prev, state, memory)
            steps.append(log_probs)
        return torch.stack(steps, 1)  # (B, T, V)


def toy_config(folder: Path, files: dict, **model) -> str:
    """A run config of the toy family on ``write_corpus`` files, trained for seconds in fp32."""
    config = {"name": "toy",
              "data": {**{f"{split}_files": files[split] for split in ("train", "val", "test")},
                       "data_dir": str(folder / "data"), "vocab_size": 100, "max_tokens": 600},
              "model": {"family": "toy", "emb_dim": 16, **model},
              "optim": {"warmup_steps": 10},
              "trainer": {"max_epochs": 1, "accelerator": "cpu", "enable_progress_bar": False,
                          "precision": "32-true"},
              "decoding": {"precision": "32-true"}}
    path = folder / "toy.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)
