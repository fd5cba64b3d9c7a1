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
from nmt.data.batching import PairDataset, ResumableLoader, TokenBatchSampler, as_batch
from nmt.data.corpus import Corpus, load_corpus
from nmt.data.prepare import load_side, prepare
from nmt.data.tokenizer import Tokenizer


@dataclass
class PreparedData:
    folder: Path  # see nmt.data.prepare
    tokenizer: Tokenizer
    text: Corpus  # {src, tgt} strings per split, read when first asked for
    src_lang: str
    tgt_lang: str


def prepare_data(cfg: DataConfig) -> PreparedData:
    """Prepare the corpus unless already done (cached), and open it."""
    folder = prepare(cfg)
    return PreparedData(folder, Tokenizer(folder / "spm.model"), load_corpus(cfg),
                        cfg.src_lang, cfg.tgt_lang)


def split_dataset(
    data: PreparedData, split: str, max_len: int | None = None, truncate: int | None = None
) -> PairDataset:
    """Pairs of one split; with ``max_len``, pairs longer than it on either side are dropped;
    with ``truncate``, both sides are cut to that many pieces."""
    src = load_side(data.folder, split, data.src_lang)
    tgt = load_side(data.folder, split, data.tgt_lang)
    if max_len is not None:
        keep = np.flatnonzero((src.lengths <= max_len) & (tgt.lengths <= max_len))
        src, tgt = src.take(keep), tgt.take(keep)
    if truncate is not None:
        src, tgt = src.truncated(truncate), tgt.truncated(truncate)
    return PairDataset(src, tgt)


def decoding_loader(dataset: PairDataset, max_tokens: int, rank: int = 0, world: int = 1):
    """Length-sorted batches for decoding; ``Batch.idx`` restores the original order."""
    sampler = TokenBatchSampler(dataset.lengths(), max_tokens, False, rank=rank, world_size=world)
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=as_batch)


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

    def epoch_finished(self) -> bool:
        """Whether training stopped at the end of an epoch (not inside one)."""
        return self.loader is not None and self.loader.position >= len(self.loader)

    def val_dataloader(self) -> DataLoader:
        return decoding_loader(
            self.val_set, self.cfg.eval_max_tokens, self.trainer.global_rank, self.trainer.world_size
        )
