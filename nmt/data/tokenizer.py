"""One joint SentencePiece model shared by both languages and both model families.

It is trained once per prepared corpus (see ``nmt.data.prepare``) on a sample of the training
source + target text. Special ids are fixed so models and search can rely on them.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import sentencepiece as spm

from nmt.errors import NMTError

PAD, UNK, BOS, EOS = 0, 1, 2, 3
EOS_PIECE = "</s>"  # EOS as the pictures and the API show it


class Tokenizer:
    """Thin wrapper over a SentencePiece model: text <-> piece ids (no BOS/EOS added)."""

    def __init__(self, model_file: str | Path):
        self.model_file = Path(model_file)
        if not self.model_file.is_file():
            raise NMTError(f"SentencePiece model not found: {self.model_file}")
        try:  # opened here first: SentencePiece calls a file it may not read "not a model"
            with open(self.model_file, "rb"):
                pass
        except OSError as err:
            raise NMTError(f"cannot read {self.model_file}: {err.strerror or err}") from None
        try:
            self.sp = spm.SentencePieceProcessor(model_file=str(self.model_file))
        except (RuntimeError, OSError):
            raise NMTError(f"{self.model_file} is not a SentencePiece model") from None

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, texts: list[str], threads: int = 1) -> list[list[int]]:
        return self.sp.encode(texts, num_threads=threads)

    def decode(self, ids: list[list[int]]) -> list[str]:
        return self.sp.decode(ids)

    def pieces(self, ids: list[int]) -> list[str]:
        return [self.sp.id_to_piece(i) for i in ids]

    def vocabulary(self) -> list[tuple[str, float]]:
        """Each id's piece and score: what decides how text is cut and what an id means. Two
        models trained on the same text have the same vocabulary, though their files differ
        (a model file also records where its training ran)."""
        return [(self.sp.id_to_piece(i), self.sp.get_score(i)) for i in range(len(self))]


# SentencePiece's unigram training splits its EM passes across threads, and the split changes
# the learned pieces: 16 threads and 2 threads give different models from the same text (the
# attention study's GPU cells, README). A fixed count makes the tokenizer the same on every
# machine; 2 is what the 2-core machines that prepared the study's first cells used.
SPM_THREADS = 2


def train_tokenizer(texts, path: Path, vocab_size: int) -> Tokenizer:
    """Train a unigram SentencePiece model on ``texts`` and write it atomically to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        prefix = os.path.join(tmp, "spm")
        try:
            _train(texts, prefix, vocab_size)
        except RuntimeError as err:  # e.g. no training text at all
            raise NMTError(f"SentencePiece training failed: {str(err).splitlines()[0]}") from None
        os.replace(prefix + ".model", path)
    return Tokenizer(path)


def _train(texts, prefix: str, vocab_size: int) -> None:
    """SentencePiece unigram training; writes ``<prefix>.model``."""
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
        num_threads=SPM_THREADS,
        minloglevel=2,
    )
