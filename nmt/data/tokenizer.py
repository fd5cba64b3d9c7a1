"""One joint SentencePiece model shared by both languages and both model families.

It is trained once on the training source + target text and cached under
``<data_dir>/spm/`` by (corpus, language pair, training lines, vocabulary size).
Special ids are fixed so models and search can rely on them.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import sentencepiece as spm

from nmt.config import DataConfig
from nmt.data.corpus import corpus_name
from nmt.errors import NMTError

PAD, UNK, BOS, EOS = 0, 1, 2, 3


class Tokenizer:
    """Thin wrapper over a SentencePiece model: text <-> piece ids (no BOS/EOS added)."""

    def __init__(self, model_file: str | Path):
        self.model_file = Path(model_file)
        if not self.model_file.is_file():
            raise NMTError(f"SentencePiece model not found: {self.model_file}")
        try:
            self.sp = spm.SentencePieceProcessor(model_file=str(self.model_file))
        except (RuntimeError, OSError):
            raise NMTError(f"{self.model_file} is not a SentencePiece model") from None

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, texts: list[str]) -> list[list[int]]:
        return self.sp.encode(texts)

    def decode(self, ids: list[list[int]]) -> list[str]:
        return self.sp.decode(ids)

    def pieces(self, ids: list[int]) -> list[str]:
        return [self.sp.id_to_piece(i) for i in ids]


def tokenizer_path(cfg: DataConfig) -> Path:
    """Cache path: the model depends on the corpus, the language pair (either direction),
    how many training lines were read, and the vocabulary size."""
    pair = "-".join(sorted((cfg.src_lang, cfg.tgt_lang)))
    lines = f".{cfg.train_lines}lines" if cfg.train_lines else ""
    name = corpus_name(cfg)
    return Path(cfg.data_dir) / "spm" / f"{name}.{pair}{lines}.{cfg.vocab_size}.model"


def train_tokenizer(texts, path: Path, vocab_size: int) -> Tokenizer:
    """Train a unigram SentencePiece model on ``texts`` and write it atomically to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        prefix = os.path.join(tmp, "spm")
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_prefix=prefix,
            vocab_size=vocab_size,
            hard_vocab_limit=False,  # a small corpus gets a smaller vocabulary, not an error
            character_coverage=1.0,
            pad_id=PAD,
            unk_id=UNK,
            bos_id=BOS,
            eos_id=EOS,
            num_threads=os.cpu_count() or 1,
            minloglevel=2,
        )
        os.replace(prefix + ".model", path)
    return Tokenizer(path)


def load_or_train_tokenizer(cfg: DataConfig, train_split) -> Tokenizer:
    """The cached joint model for this corpus and pair, trained on src+tgt if missing."""
    path = tokenizer_path(cfg)
    if path.is_file():
        return Tokenizer(path)
    texts = list(train_split["src"]) + list(train_split["tgt"])
    return train_tokenizer(texts, path, cfg.vocab_size)
