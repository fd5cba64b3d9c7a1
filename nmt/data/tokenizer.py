"""One joint SentencePiece model shared by both languages and both model families.

It is trained once per prepared corpus (see ``nmt.data.prepare``) on a sample of the training
source + target text. Special ids are fixed so models and search can rely on them.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import sentencepiece as spm

from nmt.errors import NMTError, first_line
from nmt.processes import die_with_parent

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

    def spans(self, text: str) -> tuple[list[str], list[tuple[int, int]]] | None:
        """The pieces of ``encode([text])[0]`` and each one's (begin, end) characters of
        ``text``, those it was cut from (normalisation can leave a piece none, or give it
        several); None where this SentencePiece cannot say (its offset mapping came in 0.2.3)."""
        try:
            mapping = self.sp.encode(text, return_type="offset_mapping")
        except (TypeError, ValueError):  # no return_type, or not this one
            return None
        # the pieces as ``pieces`` names them: an unknown one "<unk>", not its text
        return self.pieces(mapping["ids"]), [(begin, end) for begin, end in mapping["offsets"]]

    def decoded_spans(self, pieces: list[str], text: str) -> tuple[list[str], list[tuple[int, int]]] | None:
        """``pieces`` and each one's (begin, end) characters in ``text``, the text they decode
        to, read off the decoded prefixes (a piece's text depends on the one before: the first
        loses its space, an unknown one decodes as " ⁇ "); None where they decode to another."""
        prefixes = [self.sp.decode_pieces(pieces[: k + 1]) for k in range(len(pieces))]
        if (prefixes[-1] if prefixes else "") != text:
            return None
        ends = [len(prefix) for prefix in prefixes]
        return pieces, list(zip([0, *ends[:-1]], ends))

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


def train_tokenizer(texts: list[str], path: Path, vocab_size: int) -> Tokenizer:
    """Train a unigram SentencePiece model on ``texts`` and write it atomically to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        prefix = os.path.join(tmp, "spm")
        _train_apart(texts, prefix, vocab_size)
        os.replace(prefix + ".model", path)
    return Tokenizer(path)


def _train_apart(texts: list[str], prefix: str, vocab_size: int) -> None:
    """``_train`` in a child process, killed at once where this one is interrupted:
    SentencePiece's C++ training returns to Python, where a signal's handler runs, only when
    it ends (31 s on a sample of 200,000 pairs), and Ctrl-C and SIGTERM waited for it.
    A new interpreter, not a fork: forked after torch had run, the child hung in the OpenMP
    thread pool SentencePiece shares with torch (libgomp), whose threads a fork leaves behind.
    Started as a command, not by multiprocessing's spawn, which runs the caller's main script
    again in the child (a script calling ``train`` without a ``__main__`` guard)."""
    # The child imports this module where the parent did: a script that put a checkout on its
    # sys.path would otherwise get another nmt, or none
    command = [sys.executable, "-c", "import sys; sys.path[:] = sys.argv[1:]; "
               f"from nmt.data.tokenizer import train_child; train_child({os.getpid()})", *sys.path]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stderr=subprocess.PIPE) as child:
        try:
            _, err = child.communicate(pickle.dumps((texts, prefix, vocab_size)))
        except BaseException:  # Ctrl-C, SIGTERM (nmt.errors.Stopped)
            child.kill()
            child.wait()
            raise
    if child.returncode:  # e.g. no training text at all; killed (out of memory): no words
        said = err.decode("utf-8", "replace").splitlines()
        raise NMTError("SentencePiece training failed: "
                       + (said[-1] if said else f"exit status {child.returncode}"))


def train_child(parent: int) -> None:
    """The child ``_train_apart`` starts from process ``parent``: trains on the (texts, prefix,
    vocab size) pickled on its stdin; SentencePiece's error is its last line on stderr.
    Interrupts are its parent's to act on (a Ctrl-C reaches the whole process group), which
    kills it; and it dies with its parent: killed (the OOM killer, ``kill -9``), which then
    had no say, the parent left it training on, orphaned, for as long as its training took."""
    die_with_parent(parent)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    texts, prefix, vocab_size = pickle.load(sys.stdin.buffer)
    try:
        _train(texts, prefix, vocab_size)
    except RuntimeError as err:
        sys.exit(first_line(err))  # on stderr, exit status 1


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
