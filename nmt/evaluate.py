"""Score a run on one corpus split: decode it, score it with sacreBLEU, keep what came out.

``nmt evaluate`` writes the hypotheses and scores to ``RUN/eval/<stem>.{hyp,json}``; the stem
names the split, the beam and each decoding option chosen on the command line, so that a
non-default decoding never overwrites the default one's files. A study cell
(``nmt.study_cell``) reads and decodes its test split with the same pieces.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from nmt.average import STEPS_DIR
from nmt.config import DataConfig
from nmt.data.corpus import check_file_languages, load_corpus, read_pairs
from nmt.errors import NMTError
from nmt.files import atomic_path
from nmt.metrics import score_corpus
from nmt.provenance import device_name
from nmt.translator import Translator, decoding_options

# What greedy search (beam 1) leaves unused: its one hypothesis needs no length penalty to
# rank it, and no margin to prune beside it (nmt.search.greedy_search takes neither)
BEAM_ONLY = ("alpha", "prune_margin")
# Sentences decoded at a time, each part's end said on stderr where there are more: the
# default of translate's --buffer-lines, so that evaluate and translate batch a file alike
PART_SENTENCES = 10_000


def split_pairs(data: DataConfig, split: str) -> tuple[list[str], list[str]]:
    """Source lines and their references in ``split`` of the configured corpus."""
    corpus = load_corpus(data, needed=(split,))
    if split not in corpus:
        raise NMTError(f"split '{split}' not in the corpus; available: {', '.join(corpus)}")
    if len(corpus[split]) == 0:
        raise NMTError(f"split '{split}' of the corpus is empty")
    return list(corpus[split]["src"]), list(corpus[split]["tgt"])


def best_translations(translator, sources: list[str], beam: int | None = None,
                      alpha: float | None = None) -> list[str]:
    """The best translation of each source line (either engine's translator); ``beam`` and
    ``alpha`` default to the run's decoding config. Decoded ``PART_SENTENCES`` at a time, and
    where there are more, each part's end said on stderr: a 100,000-line test set was decoded
    in one call, 3.5 minutes greedy (longer at beam 5) without a word."""
    texts: list[str] = []
    for start in range(0, len(sources), PART_SENTENCES):
        part = sources[start : start + PART_SENTENCES]
        texts += [hyps[0].text for hyps in translator.translate(part, beam, 1, alpha,
                                                                first_line=start + 1)]
        if len(sources) > PART_SENTENCES:
            print(f"decoded {len(texts):,} of {len(sources):,} sentences", file=sys.stderr,
                  flush=True)
    return texts


def file_pairs(source: str, reference: str) -> tuple[list[str], list[str]]:
    """The lines of a source file and of its reference translations (``evaluate --files``),
    read as a corpus' files are: aligned line by line, ``.gz`` too."""
    for path in (source, reference):
        if Path(path).is_dir():
            raise NMTError(f"--files: {path} is a folder: give a source file and its references")
        if Path(path).exists() and not Path(path).is_file():  # a pipe: <(...)
            raise NMTError(f"--files: {path} is not a regular file: the results are named "
                           "after the files, so save a pipe's lines to a file first")
        if not Path(path).is_file():
            raise NMTError(f"--files: no such file: {path}")
    sources, references = [], []
    for src, ref in read_pairs((source, reference)):
        sources += src
        references += ref
    if not sources:
        raise NMTError(f"--files: {source} is empty")
    return sources, references


def paths_hash(paths: list[str]) -> str:
    """8 hex digits that tell files named by ``paths`` apart in an evaluation's file name."""
    return hashlib.sha1("\n".join(paths).encode()).hexdigest()[:8]


def files_name(source: str, reference: str) -> str:
    """What ``evaluate --files`` calls its test set in file names: the source file's name and
    a hash of both paths, so that two test sets never share a name."""
    return f"{Path(source).name}-{paths_hash([str(Path(p).resolve()) for p in (source, reference)])}"


def evaluation_pairs(data: DataConfig, split: str, files: tuple[str, str] | None = None
                     ) -> tuple[list[str], list[str]]:
    """What ``evaluate`` scores: the lines of ``files`` (a source file and its references), else
    of ``split`` of the corpus ``data`` configures. Read before the model is loaded and its
    precision probed, so that a split the corpus lacks or a bad file is an error at once."""
    if not files:
        return split_pairs(data, split)
    check_file_languages("--files", files, data.src_lang, data.tgt_lang)
    return file_pairs(*files)


def decoding_record(translator, run_dir: Path, beam: int | None = None,
                    alpha: float | None = None) -> dict:
    """How ``evaluate`` decodes, as its JSON records it: ``beam`` and ``alpha`` (default: the
    run's), the engine, the device (cpu, cuda:N) and its model (``device_name``: a GPU's
    name, or the CPU's), the precision (an export's: CTranslate2's compute type), and for the
    torch engine its prune margin and weights file (see ``weights_name``), and an ensemble's
    other members; at beam 1 neither alpha nor the margin, which greedy search leaves unused
    (``BEAM_ONLY``). Known before anything is decoded: the evaluation's file names are made
    of it."""
    beam, alpha = decoding_options(translator.config.decoding, beam, 1, alpha, len(translator.tokenizer))
    torch_engine = isinstance(translator, Translator)
    record = {"beam": beam, "alpha": alpha, "engine": "torch" if torch_engine else "ctranslate2",
              "device": str(translator.device), "device_name": device_name(translator.device),
              "precision": (translator.precision.precision if torch_engine
                            else translator.engine.compute_type)}
    if torch_engine:  # an exported model has fixed weights
        record.update(prune_margin=translator.config.decoding.prune_margin,
                      weights=weights_name(run_dir, translator.checkpoint))
        if translator.ensemble:
            record["ensemble"] = [str(path.resolve()) for path in translator.ensemble]
    if beam == 1:
        for option in BEAM_ONLY:
            record.pop(option, None)
    return record


def evaluate_split(translator, split: str, pairs: tuple[list[str], list[str]], record: dict,
                   files: tuple[str, str] | None = None) -> tuple[list[str], dict]:
    """Hypotheses and sacreBLEU scores of ``pairs`` (sources, references: ``evaluation_pairs``
    of ``split`` of the run's corpus, or of ``files``), decoded as ``record`` says
    (``decoding_record``). The scores record the split or files, and the decoding."""
    sources, references = pairs
    hyps = best_translations(translator, sources, record["beam"], record.get("alpha"))  # greedy: none
    scores = score_corpus(hyps, references)
    if files:
        scores["files"] = [str(Path(path).resolve()) for path in files]
    else:
        scores["split"] = split
    scores.update(record)
    return hyps, scores


def weights_name(run_dir: Path, checkpoint: Path) -> str:
    """The weights file evaluate decoded with: relative to the run directory where inside it."""
    path, run_dir = checkpoint.resolve(), run_dir.resolve()
    return str(path.relative_to(run_dir)) if path.is_relative_to(run_dir) else str(path)


def margin_name(margin: float | None) -> str:
    """A prune margin in a file name: none, 3, 2.5."""
    return "none" if margin is None else f"{margin:g}"


def eval_file_stem(split: str, beam: int, weights: str | None = None, alpha: float | None = None,
                   precision: str | None = None, prune_margin: str | None = None,
                   ensemble: Sequence[str] = (), device: str | None = None) -> str:
    """RUN/eval/<stem>.{hyp,json}: the split and beam, then each decoding option that was given
    (None: not given): the weights file as ``weights_name`` gives it (its stem; a file outside
    the run, or in a folder of it other than steps/, also a hash of its path, so that it never
    shares another file's names: evaluating old/step9.ckpt replaced steps/step9.ckpt's),
    alpha, precision, the device as the record names it (cpu, cuda:1; written cpu, cuda1:
    evaluating on the CPU and then on a GPU replaced the CPU's files), the prune margin as
    ``margin_name`` writes it, and the other members of an ensemble (their number with the
    run's, and a hash of their weights files' paths)."""
    parts = [f"{split}.beam{beam}"]
    if ensemble:
        parts.append(f"ensemble{len(ensemble) + 1}-{paths_hash(list(ensemble))}")
    if weights:
        path = Path(weights)
        # the run's own files by name: in it, or kept by training in steps/ (step<N>: unique);
        # a file in another folder, or outside the run, also by a hash of its path
        own = not path.is_absolute() and path.parent in (Path("."), Path(STEPS_DIR))
        parts.append(path.stem + ("" if own else f"-{paths_hash([weights])}"))
    if alpha is not None:
        parts.append(f"alpha{alpha:g}")
    if precision:
        parts.append(precision)
    if device:
        parts.append(device.replace(":", ""))  # no colon: a name scp and make read as a host or rule
    if prune_margin is not None:
        parts.append(f"prune-{prune_margin}")
    return ".".join(parts)


@contextmanager
def evaluation_writer(folder: Path, stem: str) -> Iterator[Callable[[list[str], dict], None]]:
    """What writes ``<folder>/<stem>.hyp`` (one hypothesis a line) and ``<stem>.json`` (the
    scores), both made before the block, which decodes: a place they cannot go (a folder
    that cannot be written, a file where the folder would be) is a one-line error before
    the decoding, not after it. Each is renamed into place when the block ends without
    error, and removed otherwise (``atomic_path``)."""
    with (atomic_path(folder / f"{stem}.hyp") as hyp_tmp,
          atomic_path(folder / f"{stem}.json") as json_tmp,
          open(hyp_tmp, "w", encoding="utf-8") as hyp_file,
          open(json_tmp, "w", encoding="utf-8") as json_file):
        def write(hyps: list[str], scores: dict) -> None:
            hyp_file.write("".join(h + "\n" for h in hyps))
            json_file.write(json.dumps(scores, indent=2) + "\n")

        yield write
