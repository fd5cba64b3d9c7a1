"""What attention looks at, measured: logit spread, entropy and diagonality per attention kind.

``AttentionRecorder`` runs alongside a teacher-forced forward pass and sees every scorer call
of the model, grouped by kind:

* ``encoder``: the Transformer encoder's self-attention (queries and keys: source positions);
* ``decoder``: the Transformer decoder's (causal) self-attention;
* ``cross``: attention from target positions to the source (the RNN's only attention).

For each kind it accumulates, over the real (non-pad) query rows:

* ``logit_std``: the standard deviation of the attention logits within a row (softmax
  ignores a row's offset, so the spread is what decides how peaked the weights are; Vaswani
  et al. 2017, 3.2.1: large dot products push the softmax into saturation);
* ``entropy``: H = -sum_j a_j log a_j of the weights, in nats (0 = all mass on one key);
* ``diagonal_mass`` (cross only): the share of the mass within ``DIAGONAL_BAND`` source pieces
  of the monotone diagonal j = (i + 1/2) S / T - 1/2, a measure of how monotone alignment is.

The recorder wraps each scorer's ``attend`` on the instance for the duration of a ``with``
block (and restores it after), so scorers stay free of hooks and hidden state.
Shapes: B batch, H heads, T query rows, S keys.
"""

from __future__ import annotations

import functools
import json

import torch
from torch import Tensor, nn

from nmt.attention import SCORERS, MultiHeadAttention, Scorer
from nmt.errors import NMTError, echoed

DIAGONAL_BAND = 2.0  # source pieces either side of the diagonal
KINDS = ("encoder", "decoder", "cross")


def attention_kind(module_name: str) -> str:
    """Kind of the scorer at ``module_name`` in a model of either family."""
    if module_name.startswith("encoder"):
        return "encoder"
    return "decoder" if "self_attn" in module_name else "cross"


def shape_model(model_cfg: dict) -> nn.Module:
    """The model of a config section, built on the meta device: its modules and shapes, no
    weights and no memory, so that what a family attends with is read from the family itself
    (no option names) in milliseconds. A config no family builds is an NMTError."""
    from nmt.models import build_shape_model  # late: the models are not needed for the statistics

    return build_shape_model(model_cfg, vocab_size=8)  # any vocabulary: attention does not use it


def attention_key_size(model_cfg: dict) -> int:
    """The size of the keys (and queries) the model's cross-attention scores, d_k: d_model /
    heads in a Transformer, hidden_size in the RNN, and whatever a new family's scorer is built
    with; read from the ``shape_model`` of the config section. A config no family builds, or
    whose model attends to nothing, is an NMTError."""
    from nmt.models import MODELS  # late, as in shape_model

    # A study's records repeat a few model sections (one per cell and seed, checked and then
    # tabled): each is built once, for the family and scorer classes registered now (an
    # extension, or a test, may register others under the same names).
    return _key_size(json.dumps(model_cfg, sort_keys=True), MODELS.get(model_cfg.get("family")),
                     SCORERS.get(model_cfg.get("attention")))


@functools.cache
def _key_size(model_json: str, family: type | None, scorer: type | None) -> int:
    """``attention_key_size`` of a model section (JSON); ``family`` and ``scorer``: the
    registered classes its names stand for, which key the cache alone."""
    model_cfg = json.loads(model_json)
    model = shape_model(model_cfg)
    sizes = [module.key_dim for name, module in model.named_modules()
             if isinstance(module, Scorer) and attention_kind(name) == "cross"]
    if not sizes:  # a family may attend to nothing: no statistics, no d_k to table
        raise NMTError(f"model family '{model_cfg.get('family')}' has no cross-attention scorer")
    return sizes[0]


class AttentionRecorder:
    """Context manager: statistics (and optionally the weights) of every attention call.

    Call ``start_batch(src_mask, tgt_mask)`` before each forward pass; queries of the
    encoder are source rows, queries of the decoder and cross attention are target rows,
    consumed in order (one call per layer for the Transformer, one per step for the RNN).
    """

    def __init__(self, model: nn.Module, keep_weights: bool = False):
        self.scorers = [(attention_kind(name), module) for name, module in model.named_modules()
                        if isinstance(module, Scorer)]
        self.keep_weights = keep_weights
        self.sums = {kind: torch.zeros(4, dtype=torch.float64) for kind in KINDS}
        self.weights: dict[str, list[Tensor]] = {kind: [] for kind in KINDS}  # per call

    def __enter__(self) -> AttentionRecorder:
        for kind, scorer in self.scorers:
            scorer.attend = self._recording(kind, scorer, scorer.attend)
        return self

    def __exit__(self, *exc) -> None:
        for _, scorer in self.scorers:
            del scorer.attend  # the class's method shows through again

    def start_batch(self, src_mask: Tensor, tgt_mask: Tensor) -> None:
        """(B, S) and (B, T) masks of real positions for the next forward pass."""
        self.rows = {"encoder": src_mask, "decoder": tgt_mask, "cross": tgt_mask}
        self.offsets = {id(scorer): 0 for _, scorer in self.scorers}
        self.weights = {kind: [] for kind in KINDS}

    def _recording(self, kind: str, scorer: Scorer, attend):
        def recording_attend(query, keys, values, mask, dropout=0.0, need_weights=True):
            logits = scorer.score(query, keys)  # (B, [H,] T, S), computed again for the record
            start, rows = self.offsets[id(scorer)], logits.size(-2)
            self.offsets[id(scorer)] = start + rows
            row_mask = self.rows[kind][:, start:start + rows]  # (B, T)
            if logits.dim() == 4:
                row_mask = row_mask.unsqueeze(1)  # (B, 1, T)
            keys_mask = mask if mask is not None else torch.ones_like(logits, dtype=torch.bool)
            self._accumulate(kind, logits.float(), keys_mask.expand_as(logits), row_mask, start)
            return attend(query, keys, values, mask, dropout, need_weights)

        return recording_attend

    def _accumulate(self, kind: str, logits: Tensor, keys: Tensor, rows: Tensor, start: int):
        """Add one call's per-row statistics: logits and key mask (B, [H,] T, S), rows (B, [H,] T)."""
        weights = torch.softmax(logits.masked_fill(~keys, float("-inf")), dim=-1)
        if self.keep_weights:
            self.weights[kind].append(weights)
        n = keys.sum(-1).clamp(min=1)  # keys per row
        mean = logits.masked_fill(~keys, 0).sum(-1) / n
        std = ((logits - mean.unsqueeze(-1)).pow(2).masked_fill(~keys, 0).sum(-1) / n).sqrt()
        entropy = -(weights * weights.clamp(min=1e-30).log()).sum(-1)
        diagonal = self._diagonal_mass(weights, keys, rows, start) if kind == "cross" else 0 * std
        rows = rows.expand_as(std)
        self.sums[kind] += torch.stack([rows.sum(), std[rows].sum(), entropy[rows].sum(),
                                        diagonal[rows].sum()]).double().cpu()

    def _diagonal_mass(self, weights: Tensor, keys: Tensor, rows: Tensor, start: int) -> Tensor:
        """Mass within DIAGONAL_BAND of j = (i + 1/2) S / T - 1/2 for each row i: (B, [H,] T)."""
        lengths_s = keys.sum(-1, keepdim=True).float()  # (B, [H,] T, 1) real keys
        full = self.rows["cross"]  # (B, T_all): each sentence's target length
        lengths_t = full.sum(-1).float().view(-1, *([1] * (weights.dim() - 1)))
        i = torch.arange(start, start + weights.size(-2), device=weights.device).float()
        centre = (i.unsqueeze(-1) + 0.5) * lengths_s / lengths_t - 0.5  # (B, [H,] T, 1)
        j = torch.arange(weights.size(-1), device=weights.device).float()
        near = (j - centre).abs() <= DIAGONAL_BAND
        return (weights * near).sum(-1)

    def stats(self) -> dict[str, dict[str, float]]:
        """Per kind seen: mean over real query rows (and heads) of each statistic."""
        out = {}
        for kind, (rows, std, entropy, diagonal) in self.sums.items():
            if rows == 0:
                continue
            out[kind] = {"logit_std": round(float(std / rows), 4),
                         "entropy": round(float(entropy / rows), 4)}
            if kind == "cross":
                out[kind]["diagonal_mass"] = round(float(diagonal / rows), 4)
        return out


@torch.no_grad()
def attention_statistics(model: nn.Module, batches) -> dict[str, dict[str, float]]:
    """Teacher-forced pass over ``batches`` (``Batch`` tuples); the recorder's statistics."""
    model.eval()
    device = next(model.parameters()).device
    with AttentionRecorder(model) as recorder:
        for batch in batches:
            src, tgt_in = batch.src.to(device), batch.tgt_in.to(device)
            recorder.start_batch(src != 0, batch.tgt_out.to(device) != 0)
            model(src, src != 0, tgt_in)
    return recorder.stats()


@torch.no_grad()
def teacher_forced_weights(model: nn.Module, src: list[int], tgt: list[int]) -> dict[str, Tensor]:
    """Weights of every attention kind for one sentence pair (ids without BOS/EOS; EOS is
    appended to both): {kind: (layers or steps, H, T, S)}, T and S including EOS."""
    from nmt.data.batching import collate  # late: data imports are heavy for a stats module

    batch = collate([(0, src, tgt)])
    device = next(model.parameters()).device
    model.eval()
    with AttentionRecorder(model, keep_weights=True) as recorder:
        recorder.start_batch(batch.src.to(device) != 0, batch.tgt_out.to(device) != 0)
        model(batch.src.to(device), batch.src.to(device) != 0, batch.tgt_in.to(device))
    out = {}
    for kind, calls in recorder.weights.items():
        if not calls:
            continue
        calls = [w[0] if w.dim() == 4 else w[0].unsqueeze(0) for w in calls]  # (H, T', S)
        rows = batch.src.size(1) if kind == "encoder" else batch.tgt_out.size(1)  # the queries
        if calls[0].size(-2) < rows:  # RNN: one call per target step
            out[kind] = torch.cat(calls, dim=-2).unsqueeze(0)
        else:  # Transformer: one call per layer
            out[kind] = torch.stack(calls)
    return out


def translation_attention(translator, line: str, translation, kind: str) -> tuple[Tensor, list, list]:
    """Attention of one kind for a translated line: weights (L, H, T, S), row and column labels.

    ``cross`` is what the search recorded; ``encoder`` and ``decoder`` come from a
    teacher-forced pass over the source and the translation's own pieces (Transformer only).
    """
    if kind == "cross":
        weights = translation.attention  # (T, S) for the RNN, (T, L, H, S) for the Transformer
        weights = weights[None, None] if weights.dim() == 2 else weights.permute(1, 2, 0, 3)
        return weights, translation.pieces + ["</s>"], translation.source
    src_ids = translator.encode_lines([line], warn=False)[0]  # its truncation said when translated
    tgt_ids = [translator.tokenizer.sp.piece_to_id(p) for p in translation.pieces]
    weights = teacher_forced_weights(translator.model, src_ids, tgt_ids)
    if kind not in weights:
        raise NMTError(f"this model has no {kind} self-attention (only: {', '.join(weights)})")
    if kind == "encoder":
        source = translator.tokenizer.pieces(src_ids) + ["</s>"]
        return weights[kind], source, source
    return weights[kind], translation.pieces + ["</s>"], ["<s>"] + translation.pieces


def attention_layout(model: nn.Module | None, kind: str) -> tuple[int, int]:
    """(layers, heads) of the maps ``translation_attention`` gives of ``kind``, read from the
    torch engine's ``model`` (its ``shape_model`` does: the check comes before the weights
    load), or None for CTranslate2's: (1, 1) for an RNN's one map and for CTranslate2's (the
    last layer's mean over heads; cross-attention only)."""
    if model is None:  # CTranslate2 reports the cross-attention alone
        if kind != "cross":
            raise NMTError(f"--attention-kind {kind} needs the torch engine")
        return 1, 1
    modules = list(model.named_modules())
    kinds = dict.fromkeys(attention_kind(name) for name, m in modules if isinstance(m, Scorer))
    if kind not in kinds:
        raise NMTError(f"this model has no {kind} self-attention (only: {', '.join(kinds)})")
    heads = [m.heads for name, m in modules
             if isinstance(m, MultiHeadAttention) and attention_kind(name) == kind]  # one per layer
    return (len(heads), heads[0]) if heads else (1, 1)


def check_attention_choice(layers: int, heads: int, layer: int, head: str,
                           options: tuple[str, str] = ("--attention-layer", "--attention-head"),
                           engine: str = "torch") -> None:
    """``layer`` and ``head`` (mean, all or a head number) must pick from a model's ``layers`` x
    ``heads`` attention maps (``attention_layout``); one map (an RNN's, or CTranslate2's)
    leaves nothing to pick, and CTranslate2's (``engine``) not even layer 0 or head 0: it is the
    last layer's mean over heads, which they would mislabel. ``options``: what the errors call
    the two (translate's flags, or serve's request fields)."""
    if head not in ("mean", "all") and not head.isdecimal():
        raise NMTError(f"{options[1]} must be mean, all or a head number, got '{echoed(head)}'")
    if engine != "torch" and (layer != -1 or head not in ("mean", "all")):
        raise NMTError("an export translated with CTranslate2 gives one attention map, the last "
                       f"layer's mean over heads: no {options[0]} or {options[1]} to pick")
    if (layers, heads) == (1, 1):
        if layer not in (0, -1) or head not in ("mean", "all", "0"):
            raise NMTError("this model gives one attention map (an RNN's, or CTranslate2's mean of "
                           f"the last layer's heads): no {options[0]} or {options[1]} to pick")
    elif not -layers <= layer < layers or (head.isdecimal() and not number_below(head, heads)):
        raise NMTError(f"no attention layer {echoed(str(layer))} / head {echoed(head)} in this "
                       f"model: it has {layers} layer{'s' * (layers != 1)} and {heads} "
                       f"head{'s' * (heads != 1)}, counted from 0 (layer -1 is the last)")


def number_below(digits: str, bound: int) -> bool:
    """Whether the number ``digits`` writes is below ``bound``; int() would refuse one of more
    than 4,300 digits with a traceback, and none of more than nine is a head's number."""
    return len(digits.lstrip("0")) <= 9 and int(digits) < bound


def attention_matrix(attention: Tensor, layer: int = -1, head: int | None = None) -> Tensor:
    """One (T, S) matrix from a hypothesis' attention: (T, S) as is (RNN), or (T, L, H, S)
    reduced to one layer and one head or the mean over heads (Transformer)."""
    if attention.dim() == 2:
        return attention
    per_head = attention[:, layer]  # (T, H, S)
    return per_head.mean(1) if head is None else per_head[:, head]
