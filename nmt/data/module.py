"""The data for one run: the prepared corpus (memory-mapped ids), its joint tokenizer and the
text of its splits (references for BLEU), served as Lightning loaders."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader

from nmt.config import DataConfig
from nmt.data.batching import PairDataset, ResumableLoader, TokenBatchSampler, decoding_loader
from nmt.data.corpus import Corpus, Source, split_sources
from nmt.data.prepare import load_side, prepare
from nmt.data.tokenizer import Tokenizer


@dataclass
class PreparedData:
    folder: Path  # see nmt.data.prepare
    tokenizer: Tokenizer
    text: Corpus  # {src, tgt} strings per split, read when first asked for
    src_lang: str
    tgt_lang: str


def prepare_data(cfg: DataConfig, sources: dict[str, Source] | None = None) -> PreparedData:
    """Prepare the corpus unless already done (cached), and open it; ``sources``: its splits'
    (``split_sources``), where found already. A Hub dataset is loaded once."""
    sources = split_sources(cfg) if sources is None else sources
    folder = prepare(cfg, sources)
    return PreparedData(folder, Tokenizer(folder / "spm.model"), Corpus(sources, cfg.train_lines),
                        cfg.src_lang, cfg.tgt_lang)


def split_dataset(
    data: PreparedData, split: str, max_len: int | None = None, truncate: int | None = None
) -> PairDataset:
    """Pairs of one split; with ``max_len``, the pairs training leaves out are dropped
    (``left_out``); with ``truncate``, both sides are cut to that many pieces."""
    src = load_side(data.folder, split, data.src_lang)
    tgt = load_side(data.folder, split, data.tgt_lang)
    if max_len is not None:
        empty, too_long = left_out(src.lengths, tgt.lengths, max_len)
        keep = np.flatnonzero(~(empty | too_long))
        src, tgt = src.take(keep), tgt.take(keep)
    if truncate is not None:
        src, tgt = src.truncated(truncate), tgt.truncated(truncate)
    return PairDataset(src, tgt)


def left_out(src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_len: int
             ) -> tuple[np.ndarray, np.ndarray]:
    """The training pairs left out, as two masks over the pairs: an empty side (a pair that
    teaches only to stop at once, or to translate nothing into something), and, of the rest,
    more than ``max_len`` pieces on either side."""
    empty = (src_lengths == 0) | (tgt_lengths == 0)
    too_long = ~empty & ((src_lengths > max_len) | (tgt_lengths > max_len))
    return empty, too_long


def training_pairs_note(data: PreparedData, max_len: int) -> str | None:
    """One line on the training pairs left out (``left_out``), or None where none are."""
    src = load_side(data.folder, "train", data.src_lang).lengths
    empty, too_long = left_out(src, load_side(data.folder, "train", data.tgt_lang).lengths, max_len)
    if not (empty.any() or too_long.any()):
        return None
    kept = len(src) - int(empty.sum()) - int(too_long.sum())
    return (f"training on {kept:,} of {len(src):,} pairs: left out {int(too_long.sum()):,} longer "
            f"than data.max_len ({max_len} pieces) and {int(empty.sum()):,} with an empty side")


class TranslationDataModule(L.LightningDataModule):
    """Training batches under a token budget; validation in length-sorted batches."""

    def __init__(self, data: PreparedData, cfg: DataConfig, seed: int, max_positions: int):
        super().__init__()
        self.data, self.cfg, self.seed = data, cfg, seed
        self.train_set = split_dataset(data, "train", cfg.max_len)
        # Validation keeps every pair, cut to what the model can embed (room for BOS/EOS).
        self.val_set = split_dataset(data, "val", truncate=max_positions - 1)
        self.sampler: TokenBatchSampler | None = None  # built once: the cuts never change
        self.loader: ResumableLoader | None = None  # this epoch's

    def train_dataloader(self) -> DataLoader:
        if self.sampler is None:
            self.sampler = TokenBatchSampler(
                self.train_set.lengths(), self.cfg.max_tokens, shuffle=True, seed=self.seed,
                rank=self.trainer.global_rank, world_size=self.trainer.world_size,
            )
        self.sampler.set_epoch(self.trainer.current_epoch)  # called anew each epoch (see training)
        self.loader = ResumableLoader(self.train_set, self.sampler, num_workers=self.cfg.num_workers,
                                      pin_memory=torch.cuda.is_available())
        return self.loader

    def val_dataloader(self) -> DataLoader:
        return decoding_loader(
            self.val_set, self.cfg.eval_max_tokens, self.trainer.global_rank, self.trainer.world_size
        )
