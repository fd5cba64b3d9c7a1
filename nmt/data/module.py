"""The data for one run: corpus, joint tokenizer and cached ids, served as Lightning loaders."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import datasets
import lightning as L
from torch.utils.data import DataLoader

from nmt.config import DataConfig
from nmt.data.batching import PairDataset, TokenBatchSampler, collate, encode_corpus
from nmt.data.corpus import corpus_name, load_corpus
from nmt.data.tokenizer import Tokenizer, load_or_train_tokenizer


@dataclass
class PreparedData:
    text: datasets.DatasetDict  # {src, tgt} strings per split (references for BLEU)
    ids: datasets.DatasetDict  # {src_ids, tgt_ids} per split
    tokenizer: Tokenizer


def prepare_data(cfg: DataConfig) -> PreparedData:
    """Load the corpus, train or reuse the joint tokenizer, tokenize once (cached)."""
    text = load_corpus(cfg)
    tokenizer = load_or_train_tokenizer(cfg, text["train"])
    lines = f".{cfg.train_lines}lines" if cfg.train_lines else ""
    key = f"{corpus_name(cfg)}.{cfg.src_lang}-{cfg.tgt_lang}{lines}.{tokenizer.model_file.stem}"
    ids = encode_corpus(text, tokenizer, Path(cfg.data_dir) / "cache" / key)
    return PreparedData(text=text, ids=ids, tokenizer=tokenizer)


def split_dataset(
    data: PreparedData, split: str, max_len: int | None = None, truncate: int | None = None
) -> PairDataset:
    """Pairs of one split; with ``max_len``, pairs longer than it on either side are dropped;
    with ``truncate``, both sides are cut to that many pieces."""
    src, tgt = data.ids[split]["src_ids"], data.ids[split]["tgt_ids"]
    if max_len is not None:
        keep = [i for i, (s, t) in enumerate(zip(src, tgt)) if len(s) <= max_len >= len(t)]
        src, tgt = [src[i] for i in keep], [tgt[i] for i in keep]
    if truncate is not None:
        src, tgt = [s[:truncate] for s in src], [t[:truncate] for t in tgt]
    return PairDataset(src, tgt)


def decoding_loader(dataset: PairDataset, max_tokens: int, rank: int = 0, world: int = 1):
    """Length-sorted batches for decoding; ``Batch.idx`` restores the original order."""
    sampler = TokenBatchSampler(dataset.lengths(), max_tokens, False, rank=rank, world_size=world)
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate)


class TranslationDataModule(L.LightningDataModule):
    """Training batches under a token budget; validation in length-sorted batches."""

    def __init__(self, data: PreparedData, cfg: DataConfig, seed: int, max_positions: int):
        super().__init__()
        self.data, self.cfg, self.seed = data, cfg, seed
        self.train_set = split_dataset(data, "train", cfg.max_len)
        # Validation keeps every pair, cut to what the model can embed (room for BOS/EOS).
        self.val_set = split_dataset(data, "val", truncate=max_positions - 1)

    def train_dataloader(self) -> DataLoader:
        sampler = TokenBatchSampler(
            self.train_set.lengths(),
            self.cfg.max_tokens,
            shuffle=True,
            seed=self.seed,
            rank=self.trainer.global_rank,
            world_size=self.trainer.world_size,
        )
        sampler.set_epoch(self.trainer.current_epoch)  # called anew each epoch (see training)
        return DataLoader(self.train_set, batch_sampler=sampler, collate_fn=collate)

    def val_dataloader(self) -> DataLoader:
        return decoding_loader(
            self.val_set, self.cfg.eval_max_tokens, self.trainer.global_rank, self.trainer.world_size
        )
