"""From piece ids to padded tensors: token-budget batches by length, built with numpy.

* ``Ragged`` holds sequences end to end in one flat array (a memory map for a prepared
  corpus) with each one's start and length; nothing is a Python list per sentence.
* ``PairDataset`` serves whole batches: ``__getitems__`` gathers and pads a list of pairs
  with a few array operations, no Python loop per row.
* ``TokenBatchSampler`` sorts sentences by length (ties broken at random per epoch) and cuts
  them into batches whose padded size stays under a token budget, which keeps padding small.
* ``ResumableLoader`` remembers how many batches of the epoch it has handed out, so a run
  stopped inside an epoch resumes at the next batch (Lightning saves and restores it).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from nmt.data.tokenizer import BOS, EOS, PAD


class Batch(NamedTuple):
    src: torch.Tensor  # (B, S) source ids + EOS, PAD-padded
    tgt_in: torch.Tensor  # (B, T) BOS + target ids
    tgt_out: torch.Tensor  # (B, T) target ids + EOS
    idx: torch.Tensor  # (B,) position of each pair in its split

    @property
    def src_mask(self) -> torch.Tensor:
        return self.src != PAD  # (B, S)


@dataclass(frozen=True)
class Ragged:
    """Sequences stored end to end: sequence i is ``ids[starts[i] : starts[i] + lengths[i]]``."""

    ids: np.ndarray  # (total,) piece ids
    starts: np.ndarray  # (N,) int64
    lengths: np.ndarray  # (N,) int64

    @classmethod
    def from_lists(cls, seqs: list[list[int]]) -> Ragged:
        lengths = np.fromiter(map(len, seqs), np.int64, count=len(seqs))
        ids = np.fromiter(chain.from_iterable(seqs), np.int64, count=int(lengths.sum()))
        return cls(ids, np.cumsum(lengths) - lengths, lengths)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> list[int]:
        return self.ids[self.starts[i] : self.starts[i] + self.lengths[i]].tolist()

    def take(self, rows: np.ndarray) -> Ragged:
        """The sequences at ``rows``, sharing the same ids (no copy)."""
        return Ragged(self.ids, self.starts[rows], self.lengths[rows])

    def truncated(self, size: int) -> Ragged:
        return Ragged(self.ids, self.starts, np.minimum(self.lengths, size))

    def padded(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(B, L + 1) int64 ids of ``rows``, PAD after each, L the longest; and (B,) lengths.
        The extra column leaves room for EOS."""
        lengths = self.lengths[rows]
        width = int(lengths.max(initial=0))
        cols = np.arange(width)
        inside = cols < lengths[:, None]  # (B, L) which cells hold a piece
        out = np.full((len(rows), width + 1), PAD, dtype=np.int64)
        out[:, :width][inside] = self.ids[(self.starts[rows][:, None] + cols)[inside]]
        return out, lengths


class PairDataset(Dataset):
    """Source/target id pairs (targets empty when translating)."""

    def __init__(self, src: Ragged | list[list[int]], tgt: Ragged | list[list[int]] | None = None):
        self.src = src if isinstance(src, Ragged) else Ragged.from_lists(src)
        if tgt is None:
            tgt = Ragged(np.zeros(0, np.int64), np.zeros(len(self.src), np.int64),
                         np.zeros(len(self.src), np.int64))
        self.tgt = tgt if isinstance(tgt, Ragged) else Ragged.from_lists(tgt)

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, i: int) -> tuple[int, list[int], list[int]]:
        return i, self.src[i], self.tgt[i]

    def __getitems__(self, indices: list[int]) -> Batch:
        """The DataLoader asks for a whole batch at once (no per-row fetch and collate)."""
        rows = np.asarray(indices, dtype=np.int64)
        src, src_len = self.src.padded(rows)  # (B, S)
        tgt, tgt_len = self.tgt.padded(rows)  # (B, T)
        every = np.arange(len(rows))
        src[every, src_len] = EOS
        tgt_in = np.concatenate([np.full((len(rows), 1), BOS), tgt[:, :-1]], axis=1)
        tgt[every, tgt_len] = EOS
        return Batch(torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(tgt),
                     torch.from_numpy(rows))

    def lengths(self) -> np.ndarray:
        """Padded cost of each pair: the longer side plus its BOS/EOS."""
        return np.maximum(self.src.lengths, self.tgt.lengths) + 1


def collate(items: list[tuple[int, list[int], list[int]]]) -> Batch:
    """A ``Batch`` from (index, source ids, target ids) items."""
    idx, src, tgt = zip(*items)
    batch = PairDataset(list(src), list(tgt)).__getitems__(list(range(len(items))))
    return batch._replace(idx=torch.tensor(idx))


def as_batch(batch: Batch) -> Batch:
    """The DataLoader's collate_fn: ``PairDataset.__getitems__`` already built the batch."""
    return batch


def batch_starts(sorted_lengths: np.ndarray, max_tokens: int) -> np.ndarray:
    """Where each batch begins in a length-sorted list: a batch grows while its size times
    its longest (= last) length stays within ``max_tokens``; one sentence always fits."""
    starts, s, n = [], 0, len(sorted_lengths)
    while s < n:
        starts.append(s)
        room = max(1, max_tokens // max(int(sorted_lengths[s]), 1))  # no batch is longer
        window = sorted_lengths[s : s + room]
        over = np.flatnonzero(window * np.arange(1, len(window) + 1) > max_tokens)
        s += max(1, int(over[0]) if len(over) else len(window))
    return np.asarray(starts, dtype=np.int64)


class TokenBatchSampler(Sampler[list[int]]):
    """Length-bucketed batches under a token budget (B x longest pair <= max_tokens).

    With ``shuffle`` the tie-breaking within equal lengths and the batch order are drawn
    from ``seed + epoch``, so a resumed run sees exactly the batches of an uninterrupted one.
    Under DDP each of ``world_size`` ranks takes every world_size-th training batch (dropping
    the few that would leave ranks uneven); for evaluation each rank takes every
    world_size-th sentence, so every rank has work and every sentence is decoded once.
    ``start`` skips the first batches of the epoch (a resumed run's).
    """

    def __init__(self, lengths, max_tokens: int, shuffle: bool, seed: int = 0,
                 rank: int = 0, world_size: int = 1):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.max_tokens, self.shuffle, self.seed = max_tokens, shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.epoch = self.start = 0
        self.rows = np.arange(len(self.lengths)) if shuffle else np.arange(rank, len(self.lengths),
                                                                           world_size)
        # Ties are broken by noise, so the sorted lengths and the cuts are the same each epoch.
        self.starts = batch_starts(np.sort(self.lengths[self.rows]), max_tokens)

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.start = epoch, 0

    def _batches(self) -> list[np.ndarray]:
        if not self.shuffle:
            return self._cut(self.rows[np.argsort(self.lengths[self.rows], kind="stable")])
        rng = random.Random(self.seed + self.epoch)
        noise = _python_random_floats(rng, len(self.lengths))  # rng continues after them
        batches = self._cut(np.lexsort((noise, self.lengths)))
        rng.shuffle(batches)
        batches = batches[: len(batches) // self.world_size * self.world_size]
        return batches[self.rank :: self.world_size]

    def _cut(self, order: np.ndarray) -> list[np.ndarray]:
        """Length-sorted rows -> batches (none for no rows)."""
        return np.split(order, self.starts[1:]) if len(order) else []

    def __iter__(self) -> Iterator[list[int]]:
        return (batch.tolist() for batch in self._batches()[self.start :])

    def __len__(self) -> int:
        """Batches in a whole epoch (a resumed epoch's skipped ones included)."""
        count = len(self.starts)
        return count if not self.shuffle else count // self.world_size


def _python_random_floats(rng: random.Random, n: int) -> np.ndarray:
    """``[rng.random() for _ in range(n)]`` at numpy speed: numpy's legacy generator is the
    same Mersenne Twister with the same 53-bit floats, so it continues ``rng``'s stream; ``rng``
    is then moved past the draws. (Earlier versions drew the noise in Python; this keeps the
    batches of every seed identical to theirs.)"""
    version, state, gauss = rng.getstate()
    twister = np.random.RandomState()
    twister.set_state(("MT19937", np.array(state[:-1], dtype=np.uint32), state[-1]))
    noise = twister.random_sample(n)
    _, keys, position = twister.get_state()[:3]
    rng.setstate((version, tuple(int(k) for k in keys) + (int(position),), gauss))
    return noise


class ResumableLoader(DataLoader):
    """A training DataLoader whose place in the epoch survives a checkpoint.

    Lightning saves ``state_dict()`` with every checkpoint and, resuming inside an epoch, calls
    ``load_state_dict`` on the new epoch's loader (it treats loaders with both methods as
    stateful). The position counts batches handed to the training loop; Lightning fetches a
    sized loader's batches one at a time, as it trains them.
    """

    def __init__(self, dataset: PairDataset, sampler: TokenBatchSampler, **options):
        super().__init__(dataset, batch_sampler=sampler, collate_fn=as_batch, **options)
        self.position = 0

    def __iter__(self) -> Iterator[Batch]:
        self.position = self.batch_sampler.start
        for batch in super().__iter__():
            self.position += 1
            yield batch

    def state_dict(self) -> dict:
        return {"epoch": self.batch_sampler.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        if state["epoch"] == self.batch_sampler.epoch:
            self.batch_sampler.start = self.position = state["position"]


def decoding_loader(dataset: PairDataset, max_tokens: int, rank: int = 0, world: int = 1):
    """Length-sorted batches for decoding; ``Batch.idx`` restores the original order."""
    sampler = TokenBatchSampler(dataset.lengths(), max_tokens, False, rank=rank, world_size=world)
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=as_batch)
