"""Each family with each scorer must learn to reverse short sequences (>= 95% exact match)."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from nmt.attention import SCORERS
from nmt.data.tokenizer import PAD
from nmt.search import greedy_search

from .conftest import reversal_batch, tiny_model


def exact_match(model, batch) -> float:
    model.eval()
    hyps = greedy_search(model, batch.src, batch.src_mask)
    model.train()
    gold = [[t for t in row if t > 3] for row in batch.tgt_out.tolist()]
    return sum(h.tokens == g for h, g in zip(hyps, gold)) / len(gold)


@pytest.mark.parametrize("attention", list(SCORERS))
@pytest.mark.parametrize("family", ["rnn", "transformer"])
def test_learns_reversal(family, attention):
    model = tiny_model(family, attention)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    rng = random.Random(1)
    held_out = reversal_batch(random.Random(99), 200)
    accuracy = 0.0
    for step in range(1, 601):
        batch = reversal_batch(rng, 64)
        logits = model(batch.src, batch.src_mask, batch.tgt_in)
        loss = F.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 50 == 0:
            accuracy = exact_match(model, held_out)
            if accuracy >= 0.95:
                break
    assert accuracy >= 0.95, f"{family}/{attention}: {accuracy:.2%} exact match after {step} steps"
