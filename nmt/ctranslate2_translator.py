"""Translate with a model written by ``nmt export``: the ctranslate2 engine.

``CTranslate2Translator`` offers ``Translator.translate`` over an exported directory, and warns
where the run's checkpoint it came from has changed since (``stale_export``).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import ctranslate2
import torch

from nmt.config import load_config
from nmt.data.tokenizer import EOS_PIECE, Tokenizer
from nmt.engines import decoding_device
from nmt.errors import NMTError, first_line
from nmt.export import SOURCE
from nmt.files import require_export
from nmt.models import model_option
from nmt.models.transformer import TransformerModel
from nmt.search import length_penalty, max_output_lengths
from nmt.translator import Translation, decoding_options, encode_truncated, find_checkpoint

NEVER_EMITTED = [["<pad>"], ["<s>"]]  # as in search.restrict
# CTranslate2 divides a finished hypothesis' log-probability by length ** its length penalty
# once the search is done (ours, GNMT's, is applied afterwards: ``ranked``). With a penalty of
# 0 it also stops otherwise: not at the first K hypotheses to end, as ours and fairseq do, but
# once its best candidate has ended, keeping the K of the highest log-probability among all
# that ended by then, which ranked with GNMT's penalty can give another best (3 of test2016's
# 1,000 beam-3 outputs of a small Transformer, none cut at the limit). So it runs with a
# penalty, multiplied back out of its scores (to float32 rounding: its length counts the EOS
# it returns). Any penalty but 0 stops it where ours stops, once K have ended; of more than K
# by then it keeps the K of the highest log-probability x length (-1), not the first K: one
# that ended earlier with a far lower log-probability gives way to a later one. The one it
# gives way to ranks above it with GNMT's penalty too (alpha >= 0), so the best is ours; an
# n-best list can hold another (3 to 13 of 370 sentences at beams 3 to 12, a tiny model
# trained further than the tests' run). No value of the penalty gives the first K in every case.
SEARCH_LENGTH_PENALTY = -1.0


def stale_export(model_dir: Path) -> str | None:
    """Why the export in ``model_dir`` no longer holds what its run would export now (see
    ``nmt.export.export_source``): its checkpoint has been written again, or the run now
    translates with another file. None where it still does, or where that cannot be told: an
    export made before ``SOURCE`` was kept, or one whose run is not on this machine (copied to
    a server)."""
    try:
        source = json.loads((model_dir / SOURCE).read_text(encoding="utf-8"))
        run, taken = Path(source["run"]), Path(source["checkpoint"])
        now = find_checkpoint(run, warn=False) if source["run_choice"] else taken
        modified = now.stat().st_mtime_ns
    except (OSError, ValueError, KeyError, TypeError, NMTError):  # TypeError: not an object
        return None
    if now.resolve() != taken:
        return f"{run} now translates with {now.name}, not the {taken.name} it was exported from"
    if modified != source["modified_ns"]:
        return f"{taken} has been written again since it was exported (the run trained on)"
    return None


def check_export(model_dir: str | Path) -> None:
    """A one-line ``NMTError`` where an export would not load (a damaged model.bin or
    config.json): loaded once on the CPU and let go (a server checks this before its worker
    processes load the models, whose failure is a traceback in the log; they warn where it is
    out of date)."""
    CTranslate2Translator(model_dir, "cpu", threads=1, warn=False)


@dataclass
class Found:
    """A sentence's hypotheses from CTranslate2 (pieces, EOS included where one ended), their
    log-probabilities and, where asked for, attention."""

    hypotheses: list[list[str]]
    scores: list[float]
    attention: list


class CTranslate2Translator:
    """``Translator.translate`` on an exported model, run by CTranslate2.

    Decoding follows ``nmt.search``: PAD and BOS are never emitted, each output is cut to its
    budget of ``max_len_ratio`` x source length + 5 pieces (CTranslate2 takes one maximum per
    call, so beam search runs once per budget, greedy search once with the longest; the cut
    is applied afterwards and a cut output is scored anew with a forced EOS, as ours: the
    texts are exact for greedy search), and beam hypotheses are ranked with the
    GNMT length penalty (CTranslate2's own is length ** alpha: its search stops where ours
    does and returns K finished hypotheses, with ours' best, and their raw log-probabilities,
    see ``SEARCH_LENGTH_PENALTY``). Its beam search
    differs from ours where a hypothesis meets the limit: ours ends it there, CTranslate2
    searches on past it, so hypotheses that ran past a line's own limit can end the same
    once cut, and its n-best list then holds fewer than n texts (duplicates are dropped). An
    output that ended by itself keeps CTranslate2's log-probability, whose softmax leaves
    out the suppressed PAD and BOS (ours counts them): 0.0002 nats apart
    (median over test2016's beam-5 hypotheses of a 30-minute Transformer), far more for an
    untrained model, which gives PAD and BOS weight.
    """

    def __init__(self, model_dir: str | Path, device: str | None = None, threads: int = 0,
                 warn: bool = True):
        """The export in ``model_dir`` on ``device``, with a one-line warning on stderr where
        its run's checkpoint has changed since (``stale_export``), unless ``warn`` is False."""
        model_dir = Path(model_dir)
        require_export(model_dir)
        if warn and (why := stale_export(model_dir)):
            print(f"warning: {model_dir} is out of date: {why}; export it again (nmt export)",
                  file=sys.stderr)
        self.config = load_config(model_dir / "config.yaml")
        self.tokenizer = Tokenizer(model_dir / "spm.model")
        self.max_positions = model_option(TransformerModel, self.config.model, "max_positions")
        # the CPU unless asked, as CTranslate2 itself; it takes the device index apart
        device = torch.device(decoding_device(device or "cpu", ctranslate2.get_cuda_device_count()))
        try:
            self.engine = ctranslate2.Translator(str(model_dir), device=device.type,
                                                 device_index=device.index or 0,
                                                 intra_threads=threads or torch.get_num_threads())
        except (RuntimeError, ValueError) as err:  # a damaged model.bin or config.json, or
            # no room for the model on the device: exporting again would not help there
            advice = ("free memory on the device, or decode on another device"
                      if "out of memory" in str(err).lower() else "export it again (nmt export)")
            raise NMTError(f"cannot load the CTranslate2 model in {model_dir}: {first_line(err)}; "
                           f"{advice}") from None
        # where it decodes, named as the torch engine's Translator.device (cuda:N, cpu)
        self.device = torch.device("cuda", device.index or 0) if device.type == "cuda" else device

    def encode_lines(self, lines: list[str], warn: bool = True, first_line: int = 1) -> list[list[int]]:
        """Piece ids per line, cut to what the model accepts (room left for EOS)."""
        return encode_truncated(self.tokenizer, lines, self.max_positions, warn, first_line)

    def translate(self, lines: list[str], beam_size: int | None = None, nbest: int = 1,
                  alpha: float | None = None, need_attn: bool = False,
                  first_line: int = 1, warn: bool = True) -> list[list[Translation]]:
        """Same contract as ``Translator.translate``; attention is (T, S): the last layer's
        cross-attention averaged over heads."""
        dec = self.config.decoding
        beam_size, alpha = decoding_options(dec, beam_size, nbest, alpha, len(self.tokenizer))
        alpha = 0.0 if beam_size == 1 else alpha  # greedy scores are raw, as greedy_search's
        ids = self.encode_lines(lines, warn, first_line)
        results = [[Translation("", 0.0, [], log_prob=0.0)] for _ in lines]  # empty lines
        todo = [i for i, seq in enumerate(ids) if seq]
        if not todo:
            return results
        sources = [self.tokenizer.pieces(ids[i]) + [EOS_PIECE] for i in todo]
        budgets = self._budgets(sources, dec.max_len_ratio)
        if need_attn and beam_size > 1:
            # CTranslate2 4.8's batched beam search gives every sentence the first-step
            # attention of one of them (later steps are right): decode each one alone.
            found = [self._search([s], [b], beam_size, True)[0] for s, b in zip(sources, budgets)]
        else:
            found = self._search(sources, budgets, beam_size, need_attn)
        hyps = [[self._hypothesis(result, k, budget - 1, source, need_attn)
                 for k in range(len(result.hypotheses))]
                for source, budget, result in zip(sources, budgets, found)]
        self._score_cut(sources, hyps)
        for line, sentence in zip(todo, hyps):
            results[line] = ranked(sentence, alpha)[:nbest]
        return results

    def _search(self, sources: list[list[str]], budgets: list[int], beam_size: int,
                need_attn: bool) -> list:
        """CTranslate2's search: K finished hypotheses, with their raw
        log-probabilities (``SEARCH_LENGTH_PENALTY`` taken back out). It takes
        one length limit per call, and a beam that may run past a sentence's own limit finds
        other hypotheses, so the sentences of each budget are searched together, apart from
        the others: a sentence's output does not depend on the lines beside it."""
        found: list = [None] * len(sources)
        groups: dict[int, list[int]] = {}  # budget -> its sentences, in one pass
        for i, budget in enumerate(budgets):
            # greedy search's path to a limit is the same whatever the limit: one group
            groups.setdefault(budget if beam_size > 1 else 0, []).append(i)
        penalty = SEARCH_LENGTH_PENALTY if beam_size > 1 else 0.0  # greedy: one hypothesis
        for group in groups.values():
            budget = max(budgets[i] for i in group)
            results = self.engine.translate_batch(
                [sources[i] for i in group], max_batch_size=self.config.data.eval_max_tokens,
                batch_type="tokens", beam_size=beam_size, num_hypotheses=beam_size,
                length_penalty=penalty, suppress_sequences=NEVER_EMITTED,
                max_decoding_length=budget, max_input_length=0,
                min_decoding_length=0,  # EOS may come first, as in ours
                return_scores=True, return_attention=need_attn,
                return_end_token=True)  # with the EOS step's attention row, as ours
            for i, result in zip(group, results):  # its length counts the EOS it returns
                found[i] = Found(result.hypotheses, [score * len(pieces) ** penalty for score, pieces
                                                     in zip(result.scores, result.hypotheses)],
                                 result.attention)
        return found

    def _budgets(self, sources: list[list[str]], ratio: float) -> list[int]:
        """Steps each sentence may take, EOS included, as ``search.max_output_lengths``."""
        lengths = torch.tensor([len(s) for s in sources])
        mask = torch.arange(int(lengths.max())) < lengths.unsqueeze(1)
        return max_output_lengths(mask, ratio, self.max_positions).tolist()

    def _hypothesis(self, result, k: int, limit: int, source: list[str],
                    need_attn: bool) -> Translation:
        """Hypothesis ``k`` of a result, cut to ``limit`` pieces, with its log-probability
        (EOS included) where it ended by itself within them; None where it was cut, or ended
        by CTranslate2's length limit without EOS (``_score_cut`` scores it). Unranked."""
        pieces = result.hypotheses[k]
        ended = pieces[-1:] == [EOS_PIECE] and len(pieces) - 1 <= limit
        pieces = (pieces[:-1] if pieces[-1:] == [EOS_PIECE] else pieces)[:limit]
        ids = [self.tokenizer.sp.piece_to_id(p) for p in pieces]
        translation = Translation(self.tokenizer.decode([ids])[0], 0.0, pieces,
                                  log_prob=result.scores[k] if ended else None)
        if need_attn:
            translation.attention = torch.tensor(result.attention[k])[: len(pieces) + 1]
            translation.source = source
        return translation

    def _score_cut(self, sources: list[list[str]], hyps: list[list[Translation]]) -> None:
        """The log-probability of each hypothesis cut at its sentence's limit, as
        ``search.restrict`` gives it: its pieces' and a forced EOS's (CTranslate2's score
        counted the pieces cut off, and no EOS), in one teacher-forced pass."""
        cut = [(i, hyp) for i, sentence in enumerate(hyps) for hyp in sentence if hyp.log_prob is None]
        if not cut:
            return
        scored = self.engine.score_batch(
            [sources[i] for i, _ in cut], [hyp.pieces for _, hyp in cut],
            max_batch_size=self.config.data.eval_max_tokens, batch_type="tokens",
            max_input_length=0)
        for (_, hyp), result in zip(cut, scored):
            hyp.log_prob = sum(result.log_probs)  # the pieces' and EOS's


def ranked(hyps: list[Translation], alpha: float) -> list[Translation]:
    """One sentence's hypotheses scored as ``search.beam_search`` scores them, log-probability
    / GNMT penalty, best first; of pieces found twice (cut to the same ones), the best alone."""
    best: dict[tuple[str, ...], Translation] = {}
    for hyp in hyps:
        hyp.length_penalty = length_penalty(len(hyp.pieces) + 1, alpha)
        hyp.score = hyp.log_prob / hyp.length_penalty
        key = tuple(hyp.pieces)
        if key not in best or hyp.score > best[key].score:
            best[key] = hyp
    return sorted(best.values(), key=lambda t: -t.score)
