"""The torch engine (``nmt.engines``): load a run directory and translate text with it.

Lines are decoded in length-sorted batches under a token budget and returned in input
order. Empty lines give empty outputs; lines longer than the model allows are truncated
with a warning on stderr.
"""

from __future__ import annotations

import json
import math
import os
import sys
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from nmt.config import Config, run_config
from nmt.data.batching import PairDataset, decoding_loader
from nmt.data.tokenizer import EOS_PIECE, Tokenizer
from nmt.engines import decoding_device
from nmt.errors import NMTError, first_line
from nmt.files import refuse_export
from nmt.models import build_model, build_shape_model
from nmt.models.ensemble import Ensemble
from nmt.precision import autocast_dtype, decoding_precision
from nmt.run_identity import check_identity, identity_difference, identity_of_run
from nmt.search import MAX_ALPHA, Hypothesis, beam_search, greedy_search


@dataclass
class Translation:
    """One hypothesis of a line: its text, its score, and what pictures and n-best lists need."""

    text: str
    score: float  # log_prob / length_penalty: what ranks the n-best list
    pieces: list[str]  # target pieces, for attention plots
    attention: torch.Tensor | None = None  # (len(pieces) + 1, ..., S), see models.base
    source: list[str] | None = None  # source pieces + EOS: the attention's columns
    log_prob: float | None = None  # the model's log-probability of pieces + EOS
    length_penalty: float = 1.0  # GNMT lp(len(pieces) + 1); 1 for greedy search


def moses_nbest(results: list[list[Translation]], first_id: int = 0) -> list[str]:
    """Moses n-best lines ``id ||| text ||| features ||| score``, id counting input lines
    from 0 (``first_id``: the id of ``results[0]``, where the input comes in chunks).
    Features: ``logprob=`` the model's log-probability of the text's pieces + EOS, ``lp=`` the
    length penalty it was divided by; score = logprob / lp. The text is written as is (as
    Moses and Marian do): the fields around it never hold " ||| ", so a text that does is
    read back by splitting on the first separator and the last two (docs/usage.md, N-best lists)."""
    rows = []
    for number, hyps in enumerate(results, start=first_id):
        for t in hyps:
            features = "" if t.log_prob is None else f"logprob= {t.log_prob:.4f} "
            features += f"lp= {t.length_penalty:.4f}"
            rows.append(f"{number} ||| {t.text} ||| {features} ||| {t.score:.4f}")
    return rows


def source_limit(max_positions: int) -> int:
    """The pieces a source line may have: the model's positions, less one for EOS."""
    return max_positions - 1


def encode_truncated(tokenizer: Tokenizer, lines: list[str], max_positions: int,
                     warn: bool = True, first_line: int = 1) -> list[list[int]]:
    """Piece ids per line, each cut to ``source_limit`` (room for EOS), with a warning on
    stderr naming the line (``lines[0]`` is line ``first_line`` of the input) unless ``warn``
    is False: the one rule of every engine."""
    limit = source_limit(max_positions)
    ids = tokenizer.encode(lines)
    for number, seq in enumerate(ids, start=first_line):
        if len(seq) > limit:
            if warn:
                print(f"warning: line {number} has {len(seq)} pieces; truncated to {limit}",
                      file=sys.stderr)
            del seq[limit:]
    return ids


def check_max_len_ratio(ratio: float) -> None:
    """Outputs may take ratio x source length + 5 steps: a negative ratio leaves none."""
    if not ratio >= 0:  # NaN too
        raise NMTError(f"decoding.max_len_ratio must be 0 or more, got {ratio}")


def decoding_options(dec, beam_size: int | None, nbest: int, alpha: float | None,
                     vocab: int | None = None) -> tuple[int, float]:
    """Beam size and length penalty: the arguments given, else the run's decoding config;
    an impossible beam / n-best pair, a beam over the ``vocab`` size, a negative length
    penalty, prune margin or output length ratio is a one-line error."""
    check_max_len_ratio(dec.max_len_ratio)
    beam_size = dec.beam_size if beam_size is None else beam_size
    alpha = dec.alpha if alpha is None else alpha
    check_beam(beam_size, vocab)
    if not 1 <= nbest <= beam_size:
        raise NMTError(f"need beam >= 1 and 1 <= nbest <= beam, got beam {beam_size}, nbest {nbest}")
    if not math.isfinite(alpha):
        raise NMTError(f"the length penalty alpha must be a number, got {alpha}")
    # Below 0 the penalty would favour short outputs beyond their log-probability, beam
    # search could no longer stop a sentence early (search.Finished), and the CTranslate2
    # engine's best could differ from ours (nmt.ctranslate2_translator): GNMT's alpha is 0
    # (none) or more. Above MAX_ALPHA it overflowed (a traceback) on long outputs.
    if not 0 <= alpha <= MAX_ALPHA:
        raise NMTError(f"the length penalty alpha must be from 0 (none) to {MAX_ALPHA:g}, got "
                       f"{alpha}")
    if dec.prune_margin is not None and not dec.prune_margin >= 0:  # NaN too
        raise NMTError(f"the prune margin must be >= 0 nats or none, got {dec.prune_margin}")
    return beam_size, alpha


def check_beam(beam_size: int, vocab: int | None = None) -> None:
    """A beam of at least 1 and at most the ``vocab`` size, or a one-line error."""
    if beam_size < 1:
        raise NMTError(f"need beam >= 1, got beam {beam_size}")
    if vocab is not None and beam_size > vocab:  # memory grows with it: bad_alloc, or the OOM killer
        raise NMTError(f"beam {beam_size:,} is more than the vocabulary's {vocab:,} pieces, the most "
                       "a first step can tell apart: give a smaller --beam")


HERE = ("./", f".{os.sep}")  # how a path from the current folder begins ...
FROM_HERE = (*HERE, "../", f"..{os.sep}")  # ... or from the one above it


# The checkpoints training writes at the top of a run (averaged.ckpt: nmt average's too)
RUN_WEIGHTS = ("best.ckpt", "last.ckpt", "averaged.ckpt")


def find_checkpoint(run_dir: Path, weights: str | Path | None = None, warn: bool = True) -> Path:
    """The weights file to decode ``run_dir`` with: ``weights`` where given
    (``_given_weights``), else the one the run chose (``_run_weights``, which warns unless
    ``warn`` is False: a check before the load that warns)."""
    if weights is not None:
        return _given_weights(run_dir, weights)
    return _run_weights(run_dir, warn)


def _given_weights(run_dir: Path, weights: str | Path) -> Path:
    """``weights``: a file in the run directory (e.g. averaged.ckpt from ``nmt average``,
    steps/step30.ckpt), else a path with a folder in it as given (absolute, or from the
    current directory; a bare name is never looked for outside the run, one that begins with
    ./ or ../ never inside it; one of another run that decodes otherwise is an error, see
    ``check_weights_of``)."""
    inside, given = run_dir / weights, Path(weights)
    from_here = str(weights).startswith(FROM_HERE)  # Path drops a "./": read it as given
    if given.is_absolute() or from_here:
        tried = [given]
    else:
        tried = [inside] if given.parent == Path(".") else [inside, given]
    for path in tried:
        if path.is_file():
            check_weights_of(run_dir, path)
            return path
    if folder := next((path for path in tried if path.is_dir()), None):  # not "not found"
        raise NMTError(f"--weights {weights}: {folder} is a folder; name a checkpoint file")
    hint = _weights_elsewhere(run_dir, str(weights), given)
    if from_here:
        raise NMTError(f"weights file not found: {weights} ({given.resolve()}){hint}")
    raise NMTError(f"weights file not found: {' or '.join(map(str, tried))}{hint}")


def _run_weights(run_dir: Path, warn: bool) -> Path:
    """The run's final weights (train_stats.json, see ``nmt.average.final_weights``), else
    best.ckpt, else last.ckpt, with a warning where the final weights are gone, if ``warn``."""
    chosen = final_weights_of(run_dir)
    for name in (chosen, "best.ckpt", "last.ckpt"):
        if name and (run_dir / name).is_file():
            if warn and chosen and name != chosen:
                print(f"warning: {run_dir / chosen}, the weights training chose, is gone: "
                      f"using {name}", file=sys.stderr)
            return run_dir / name
    refuse_export(run_dir, "decode it with --engine ctranslate2")
    # the run's config was read before: a run directory, one that has not saved weights yet
    raise NMTError(f"no best.ckpt or last.ckpt in {run_dir} yet: a run saves them from its first "
                   "validation on, which one still training may not have reached")


def _weights_elsewhere(run_dir: Path, weights: str, given: Path) -> str:
    """Where a ``--weights`` file that was not found is after all, and what to give for it: in
    the run, named from the current folder (./averaged.ckpt), or in the current folder, named
    bare (avg.ckpt, as ``nmt average --out avg.ckpt`` writes it), which is looked for in the
    run alone. An empty string where it is in neither."""
    if weights.startswith(HERE) and (run_dir / given).is_file():
        return f"; {run_dir / given} exists: give {given} for it"
    if not weights.startswith(FROM_HERE) and given.parent == Path(".") and given.is_file():
        return (f"; {given} is in the current folder, where a bare name is not looked for: "
                f"give ./{given} for it")
    return ""


def check_weights_of(run_dir: Path, path: Path) -> None:
    """A one-line error where ``path``, a weights file ``--weights`` names, is a checkpoint of
    another training run that decodes otherwise than ``run_dir``: whose identity (language
    pair, family, scorer, SentencePiece model, model options) differs from ``run_dir``'s, read
    from the two runs' folders (``identity_difference``, as a checkpoint's own is compared).
    Weights of the same shapes load into ``run_dir``'s model whatever run wrote them, and
    would translate silently wrong (into the source language, with a scorer or heads they were
    not trained with, their piece ids read as other pieces). A run's checkpoints are its
    best.ckpt, last.ckpt, averaged.ckpt and those in its steps/; another file in it may be
    another run's (``nmt average --out`` writes a new .ckpt anywhere)."""
    if path.name in RUN_WEIGHTS:
        other = path.parent
    elif path.parent.name == "steps":  # nmt.average.STEPS_DIR, kept by training
        other = path.parent.parent
    else:
        return
    if other.resolve() == run_dir.resolve() or (theirs := identity_of_run(other)) is None:
        return  # this run, or no run to compare
    if why := identity_difference(theirs, identity_of_run(run_dir), run_dir):
        raise NMTError(f"--weights {path} is a checkpoint of the run {other}, {why}: give "
                       f"--checkpoint {other} for its weights")


def final_weights_of(run_dir: Path) -> str | None:
    """The weights file training named in train_stats.json; None for a run from before that
    choice, and for one resumed since (training drops the choice when it resumes)."""
    try:
        stats = json.loads((run_dir / "train_stats.json").read_text())
    except (OSError, ValueError):
        return None
    weights = stats.get("final_weights") if isinstance(stats, dict) else None
    return weights if isinstance(weights, str) else None


def load_run(run_dir: str | Path, device: torch.device, weights: str | Path | None = None
             ) -> tuple[torch.nn.Module, Tokenizer, Config, Path]:
    """A run directory's model (on ``device``, with the weights ``find_checkpoint`` picks),
    tokenizer and config, and the weights file."""
    config, run_dir = run_config(run_dir), Path(run_dir)
    tokenizer = Tokenizer(run_dir / "spm.model")
    model = build_model(config.model, len(tokenizer))
    path = find_checkpoint(run_dir, weights)
    load_weights(model, path, device, run_dir=run_dir)
    return model.to(device), tokenizer, config, path


def load_weights(model: torch.nn.Module, path: Path, device: torch.device | str,
                 mapped: bool = False, run_dir: Path | None = None) -> None:
    """The weights of checkpoint ``path`` into ``model``; a one-line error where they do not
    fit it or are not finite, or where they were trained for another run than ``run_dir``,
    the run whose model it is (``check_identity``). ``mapped``: the file memory-mapped and its
    tensors assigned, not copied (a model on the meta device is then checked with one read
    of the file)."""
    expected = None if run_dir is None else identity_of_run(run_dir)
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=False,
                                mmap=mapped and zipfile.is_zipfile(path))
        check_identity(checkpoint, expected, path, run_dir)
        state = {k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items()}
        model.load_state_dict(state, assign=mapped)
    except NMTError:  # check_identity's
        raise
    except OSError as err:  # not the file's fault (no read permission, a failing disk)
        raise NMTError(f"cannot read {path}: {err.strerror or err}") from None
    except Exception as err:  # unpickling, missing keys, shape mismatches, ...
        # torch's reason is on the lines after "Error(s) in loading state_dict for ...:"
        reason = " ".join(str(err).split())
        reason = reason if len(reason) <= 300 else reason[:300] + " ..."
        raise NMTError(f"cannot load {path}: incompatible or damaged checkpoint "
                       f"({reason or first_line(err)})") from None
    if not all(t.isfinite().all() for t in state.values() if t.is_floating_point()):
        raise NMTError(f"cannot load {path}: its weights are not finite (NaN or infinite): the "
                       "training that wrote it diverged")


def check_run_weights(run_dir: str | Path, weights: str | Path | None = None) -> Path:
    """The weights file ``find_checkpoint`` picks, after a one-line error where it would not
    load into the run's model: checked on a model on the meta device, from the memory-mapped
    file (a server checks this before its worker processes load the models)."""
    config, run_dir = run_config(run_dir), Path(run_dir)
    model = build_shape_model(config.model, len(Tokenizer(run_dir / "spm.model")))
    path = find_checkpoint(run_dir, weights, warn=False)  # the workers' load warns
    load_weights(model, path, "cpu", mapped=True, run_dir=run_dir)
    return path


def check_ensemble(run_dir: str | Path, ensemble: list[str | Path],
                   weights: str | Path | None) -> None:
    """Before any weights load, one-line errors for runs that cannot decode as one. The
    members are training runs with weights (``weights`` names a file in each: a path would give
    every member the same weights), each named once (a run beside itself, the same weights
    twice, translates as it does alone, for twice the time), of the same language pair, and
    over one vocabulary: the same SentencePiece pieces, which runs on the same corpus and
    ``data.vocab_size`` have."""
    if weights is not None and Path(weights).name != str(weights):
        raise NMTError(f"--weights {weights} with --ensemble names a file in each run (e.g. "
                       "averaged.ckpt), not a path")
    refuse_export(run_dir, "--ensemble takes training runs")
    config = run_config(run_dir)
    pair = (config.data.src_lang, config.data.tgt_lang)
    vocabulary = Tokenizer(Path(run_dir) / "spm.model").vocabulary()
    named = {Path(run_dir).resolve(): run_dir}  # each member's folder, however written
    for other in ensemble:
        refuse_export(other, "--ensemble takes training runs")
        folder = Path(other).resolve()
        if folder in named:
            raise NMTError(f"--ensemble {other} is {named[folder]} again: a model beside itself "
                           "translates as it does alone; name each run once")
        named[folder] = other
        other_config = run_config(other)
        find_checkpoint(Path(other), weights, warn=False)  # load_run warns
        if (other_config.data.src_lang, other_config.data.tgt_lang) != pair:
            raise NMTError(f"cannot ensemble {other} ({other_config.data.src_lang}->"
                           f"{other_config.data.tgt_lang}) with {run_dir} ({pair[0]}->{pair[1]})")
        if Tokenizer(Path(other) / "spm.model").vocabulary() != vocabulary:
            raise NMTError(f"cannot ensemble {other} with {run_dir}: their SentencePiece models "
                           "differ, and an ensemble needs one vocabulary (runs prepared from the "
                           "same corpus with the same data.train_lines, vocab_size and spm_sample "
                           "share it)")


class Translator:
    """A trained model with its tokenizer and config, decoding text: ``from_run_dir`` loads a
    run (its chosen weights, or ``--weights``, or an ensemble), ``translate`` decodes lines in
    sorted batches with the run's search (greedy or beam) and gives each line's n-best
    ``Translation``s. The torch engine; ``nmt.ctranslate2_translator`` is the other."""

    def __init__(self, model: torch.nn.Module, tokenizer: Tokenizer, config: Config,
                 precision: str | None = None, sentences: int | None = None,
                 beam: int | None = None, checkpoint: Path | None = None):
        """``precision``: 32-true, bf16-mixed or auto (default: the config's decoding.precision);
        ``auto`` decides for ``sentences`` decoded together (default: a batch of
        data.eval_max_tokens) at ``beam`` (default: the config's decoding.beam_size), see
        ``decoding_precision``."""
        if beam is not None:  # auto's probe decodes at it: a beam translate refuses, refused first
            check_beam(beam, len(tokenizer))
        self.model, self.tokenizer, self.config = model.eval(), tokenizer, config
        self.checkpoint = checkpoint  # the file the weights came from, where known
        self.ensemble: list[Path] = []  # the other members' weights files, in an ensemble
        self.precision = decoding_precision(config, model, self.device.type, precision, sentences,
                                            beam)

    @classmethod
    def from_run_dir(cls, run_dir: str | Path, device: str | None = None,
                     weights: str | Path | None = None, precision: str | None = None,
                     sentences: int | None = None, beam: int | None = None,
                     ensemble: Sequence[str | Path] = ()) -> Translator:
        """Model, tokenizer and config from ``run_dir``; weights from ``weights`` if given, else
        the run's final weights (see ``find_checkpoint``). ``precision``, ``sentences`` and
        ``beam`` as for ``Translator``. With ``ensemble`` (more run directories, the same
        ``weights`` file name in each), the runs decode as one model (``nmt.models.ensemble``)
        with ``run_dir``'s tokenizer and decoding options."""
        device = decoding_device(device)
        if ensemble:
            check_ensemble(run_dir, ensemble, weights)
        model, tokenizer, config, path = load_run(run_dir, device, weights)
        others = [load_run(other, device, weights) for other in ensemble]
        if others:
            models, _, configs, paths = zip(*others)
            model = Ensemble([model, *models])
            # the probe of --precision auto is cached by this: the members' configs
            config = replace(config, model={"family": "ensemble",
                                            "members": [config.model, *(c.model for c in configs)]})
        translator = cls(model, tokenizer, config, precision, sentences, beam, path)
        translator.ensemble = list(paths) if others else []
        return translator

    @property
    def max_positions(self) -> int:
        return self.model.max_positions

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def autocast_context(self) -> torch.autocast:
        """Autocast to the decoding precision (disabled at full precision)."""
        dtype = autocast_dtype(self.precision)
        return torch.autocast(self.device.type, dtype, enabled=dtype is not None)

    def translate(
        self,
        lines: list[str],
        beam_size: int | None = None,
        nbest: int = 1,
        alpha: float | None = None,
        need_attn: bool = False,
        first_line: int = 1,
        warn: bool = True,
    ) -> list[list[Translation]]:
        """Translate ``lines``; for each its ``nbest`` translations (one empty for an empty
        line). With ``need_attn`` each translation carries its source attention.
        ``first_line``: the input's number of ``lines[0]``, for the warnings on stderr about
        lines cut to the model's length (none with ``warn`` False)."""
        dec = self.config.decoding
        beam_size, alpha = decoding_options(dec, beam_size, nbest, alpha, len(self.tokenizer))
        ids = self.encode_lines(lines, warn, first_line)
        results = [[Translation("", 0.0, [], log_prob=0.0)] for _ in lines]  # empty lines
        todo = [i for i, seq in enumerate(ids) if seq]
        loader = decoding_loader(PairDataset([ids[i] for i in todo]), self.config.data.eval_max_tokens)
        for batch in loader:
            src = batch.src.to(self.device)
            mask = batch.src_mask.to(self.device)
            with self.autocast_context():
                if beam_size == 1:
                    found = [[h] for h in greedy_search(self.model, src, mask, dec.max_len_ratio,
                                                        need_attn)]
                else:
                    found = beam_search(self.model, src, mask, beam_size, alpha, dec.max_len_ratio,
                                        nbest, need_attn, dec.prune_margin)
            for position, hyps in zip(batch.idx.tolist(), found):
                line = todo[position]
                results[line] = [self._result(h, ids[line]) for h in hyps]
        return results

    def encode_lines(self, lines: list[str], warn: bool = True, first_line: int = 1) -> list[list[int]]:
        """Piece ids per line, cut to what the model accepts (room left for EOS)."""
        return encode_truncated(self.tokenizer, lines, self.max_positions, warn, first_line)

    def _result(self, hyp: Hypothesis, src_ids: list[int]) -> Translation:
        """Detokenized text; attention cut to this sentence's source (+ EOS) columns."""
        translation = Translation(self.tokenizer.decode([hyp.tokens])[0], hyp.score,
                                  self.tokenizer.pieces(hyp.tokens), log_prob=hyp.log_prob,
                                  length_penalty=hyp.penalty)
        if hyp.attention is not None:
            translation.attention = hyp.attention[..., : len(src_ids) + 1]
            translation.source = self.tokenizer.pieces(src_ids) + [EOS_PIECE]
        return translation
