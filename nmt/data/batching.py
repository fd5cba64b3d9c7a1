"""From text pairs to padded tensors: piece ids cached once, token-budget batches by length.

* ``encode_corpus`` turns {src, tgt} text into {src_ids, tgt_ids} once and caches the result
  as Arrow files, so later runs (and every epoch) skip tokenization.
* ``TokenBatchSampler`` sorts sentences by length (ties broken at random per epoch) and cuts
  them into batches whose padded size stays under a token budget, which keeps padding small.
* ``collate`` pads a list of pairs into a ``Batch`` with BOS/EOS added.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import datasets
import torch
from torch.utils.data import Dataset, Sampler

from nmt.data.tokenizer import BOS, EOS, PAD, Tokenizer


class Batch(NamedTuple):
    src: torch.Tensor  # (B, S) source ids + EOS, PAD-padded
    tgt_in: torch.Tensor  # (B, T) BOS + target ids
    tgt_out: torch.Tensor  # (B, T) target ids + EOS
    idx: torch.Tensor  # (B,) position of each pair in its split

    @property
    def src_mask(self) -> torch.Tensor:
        return self.src != PAD  # (B, S)


def encode_corpus(corpus: datasets.DatasetDict, tokenizer: Tokenizer, cache_dir: Path):
    """Piece ids of every split, cached under ``cache_dir`` (Arrow, memory-mapped)."""
    if cache_dir.is_dir():
        return datasets.load_from_disk(str(cache_dir))

    def encode(rows):
        return {"src_ids": tokenizer.encode(rows["src"]), "tgt_ids": tokenizer.encode(rows["tgt"])}

    ids = corpus.map(encode, batched=True, batch_size=2000, remove_columns=["src", "tgt"])
    tmp = cache_dir.with_name(f"{cache_dir.name}.tmp{os.getpid()}")
    ids.save_to_disk(str(tmp))
    try:
        tmp.rename(cache_dir)  # a cache folder is complete or absent, never half-written
    except OSError:  # another process (a DDP rank) finished first: keep its copy
        shutil.rmtree(tmp, ignore_errors=True)
    return datasets.load_from_disk(str(cache_dir))


class PairDataset(Dataset):
    """Id pairs held as Python lists: indexing is a list lookup, not an Arrow row read."""

    def __init__(self, src_ids: list[list[int]], tgt_ids: list[list[int]] | None = None):
        self.src = src_ids
        self.tgt = tgt_ids if tgt_ids is not None else [[] for _ in src_ids]

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, i: int) -> tuple[int, list[int], list[int]]:
        return i, self.src[i], self.tgt[i]

    def lengths(self) -> list[int]:
        """Padded cost of each pair: the longer side plus its BOS/EOS."""
        return [max(len(s), len(t)) + 1 for s, t in zip(self.src, self.tgt)]


def collate(items: list[tuple[int, list[int], list[int]]]) -> Batch:
    idx, src, tgt = zip(*items)
    return Batch(
        src=_pad([s + [EOS] for s in src]),
        tgt_in=_pad([[BOS] + t for t in tgt]),
        tgt_out=_pad([t + [EOS] for t in tgt]),
        idx=torch.tensor(idx),
    )


def _pad(seqs: list[list[int]]) -> torch.Tensor:
    out = torch.full((len(seqs), max(map(len, seqs))), PAD, dtype=torch.long)
    for row, seq in enumerate(seqs):
        out[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return out


class TokenBatchSampler(Sampler[list[int]]):
    """Length-bucketed batches under a token budget (B x longest pair <= max_tokens).

    With ``shuffle`` the tie-breaking within equal lengths and the batch order are drawn
    from ``seed + epoch``, so a resumed run sees exactly the batches of an uninterrupted one.
    Under DDP each of ``world_size`` ranks takes every world_size-th training batch (dropping
    the few that would leave ranks uneven); for evaluation each rank takes every
    world_size-th sentence, so every rank has work and every sentence is decoded once.
    """

    def __init__(
        self,
        lengths: list[int],
        max_tokens: int,
        shuffle: bool,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        self.lengths = lengths
        self.max_tokens = max_tokens
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _batches(self) -> list[list[int]]:
        rng = random.Random(self.seed + self.epoch)
        noise = [rng.random() for _ in self.lengths] if self.shuffle else [0.0] * len(self.lengths)
        indices = range(len(self.lengths))
        if not self.shuffle:
            indices = indices[self.rank :: self.world_size]
        order = sorted(indices, key=lambda i: (self.lengths[i], noise[i]))
        batches, current, longest = [], [], 0
        for i in order:
            longest_if_added = max(longest, self.lengths[i])
            if current and longest_if_added * (len(current) + 1) > self.max_tokens:
                batches.append(current)
                current, longest_if_added = [], self.lengths[i]
            current.append(i)
            longest = longest_if_added
        if current:
            batches.append(current)
        if not self.shuffle:
            return batches
        rng.shuffle(batches)
        batches = batches[: len(batches) // self.world_size * self.world_size]
        return batches[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._batches())

    def __len__(self) -> int:
        return len(self._batches())
