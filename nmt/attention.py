"""Attention scorers behind one interface, shared by the RNN and the Transformer.

A scorer turns queries and keys into logits; everything else (masking, softmax, dropout,
the weighted sum of values) is done once, in ``Scorer.attend``:

    weights = softmax(score(q, k) masked),  context = weights @ values

``prepare_keys`` does the key-side work once per sentence so that decoding steps reuse it.
Scorers keep no state between calls. Adding a scorer = one subclass (``score`` and
``score_flops``, ``prepare_keys`` where it has key-side work) + one ``SCORERS`` entry: the
command line, the FLOP counts and the tests that run every scorer find it there; the attention
study runs it once a preset of ``configs/compare.yaml`` names it.
All tensors may carry extra leading dims (heads): queries (..., T, Dq), keys (..., S, Dk).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from nmt.dropout import dropout as apply_dropout
from nmt.errors import NMTError


class Scorer(nn.Module, ABC):
    """Base class: subclasses implement ``score`` and ``score_flops`` and, if they have
    key-side work, ``prepare_keys`` (a subclass missing one cannot be built: a TypeError)."""

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int):
        super().__init__()
        self.query_dim, self.key_dim = query_dim, key_dim

    def prepare_keys(self, keys: Tensor) -> Tensor:
        """(..., S, Dk) -> (..., S, D') key-side projection, computed once per sentence."""
        return keys

    @abstractmethod
    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        """(..., T, Dq), prepared keys (..., S, D') -> logits (..., T, S)."""

    @abstractmethod
    def score_flops(self, t: int, s: int) -> int:
        """Forward FLOPs of the scorer's own work for T queries over S keys (one head, one
        sentence; 2 per multiply-add): ``prepare_keys``, ``score``, and any work it adds to
        ``attend`` beyond the weighted sum of values (symmetric's projection). Elementwise
        work is counted where it is of the additive scorers' (T, S, A) size, not the small
        scalings. What does not grow with T must be ``prepare_keys``' own: the RNN counts
        ``score_flops(0, s)`` once per sentence and the rest at every decoder step."""

    def flops(self, t: int, s: int) -> int:
        """Forward FLOPs of ``attend`` for T queries and S keys (one head, one sentence):
        the scorer's own work (``score_flops``) plus the weighted sum of values."""
        return self.score_flops(t, s) + 2 * t * s * self.key_dim

    def attend(
        self,
        query: Tensor,
        keys: Tensor,
        values: Tensor,
        mask: Tensor | None,
        dropout: float = 0.0,
        need_weights: bool = True,
    ) -> tuple[Tensor, Tensor | None]:
        """Masked attention: (..., T, Dq), prepared keys (..., S, D'), values (..., S, Dv),
        mask broadcastable to (..., T, S), True = may attend -> context (..., T, Dv) and
        weights (..., T, S) (None when not needed and the scorer can skip them). A query
        whose mask hides every key gets zero weights and a zero context."""
        logits = self.score(query, keys)
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(logits, dim=-1)
        if mask is not None:
            # softmax over a row of -inf is NaN, which a padded query's row (a family's
            # (B, T, S) mask that hides padded queries' keys) would carry into the gradient:
            # zeros, as torch's fused scaled_dot_product_attention gives such rows
            weights = weights.masked_fill(~mask.any(-1, keepdim=True), 0.0)  # (..., T, S)
        context = apply_dropout(weights, dropout, self.training) @ values
        return context, weights


class AdditiveScorer(Scorer):
    """Bahdanau et al. (2015), eq. (6) of appendix A.1.2: e = v^T tanh(W q + U k).

    The broadcast sum materialises a (..., T, S, A) tensor, which is the cost of this scorer.
    It is computed through tanh(x) = 2 sigmoid(2x) - 1, so that

        e = 2 v^T sigmoid(2 (W q + U k)) - sum(v),

    the same logits in exact arithmetic, with torch's sigmoid in place of its tanh over the
    large tensor. In fp32 the two agree to rounding (under 1e-6); under bf16 autocast the
    sigmoid form strays about 1.7x further from the fp32 logits than the tanh form would
    (max error 0.012 against 0.007, attention weights within 8e-4 of fp32's against 5e-4;
    A = 512, random inputs, on an AMD EPYC Zen 5), as v then sums values near 1 before
    sum(v) is taken off.
    On a 2-core AMD EPYC (Zen 3, fp32) the sigmoid kernel ran 3.2x faster over the large
    tensor and the RNN's beam search 1.21x (docs/performance.md; training steps did not move).
    The factor 2 inside the sigmoid goes on the small W q at each step and on U k once per
    sentence (``prepare_keys`` returns 2 U k), so the large tensor is made by a plain sum:
    folded into that sum instead (``add(..., alpha=2)``), the factor cost every decoder step's
    backward one more pass over the (..., T, S, A) gradient (RNN training steps 1.01x faster
    without it, docs/performance.md).
    """

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int):
        super().__init__(query_dim, key_dim, hidden_dim)
        self.query_proj = nn.Linear(query_dim, hidden_dim, bias=False)  # W
        self.key_proj = nn.Linear(key_dim, hidden_dim, bias=False)  # U
        self.v = nn.Linear(hidden_dim, 1, bias=False)

    def prepare_keys(self, keys: Tensor) -> Tensor:
        return 2 * self.key_proj(keys)  # 2 U k: (..., S, A), the sigmoid form's factor

    def score_flops(self, t: int, s: int) -> int:
        a = self.v.in_features  # W q, U k, the (T, S, A) sum and sigmoid, then v
        return 2 * t * self.query_dim * a + 2 * s * self.key_dim * a + 4 * t * s * a

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        """(..., T, Dq), prepared keys 2 U k (..., S, A) -> logits (..., T, S)."""
        q = self.query_proj(query).unsqueeze(-2)  # W q: (..., T, 1, A)
        pairs = torch.sigmoid(2 * q + keys.unsqueeze(-3))  # sigmoid(2 (W q + U k)): (..., T, S, A)
        return 2 * self.v(pairs).squeeze(-1) - self.v.weight.sum()  # (..., T, S)


class AdditiveDeepScorer(AdditiveScorer):
    """A deeper learned scorer: additive attention with one more hidden layer,
    e = v^T tanh(W2 tanh(W q + U k)).

    W2 acts on every (query, key) pair, so it multiplies the additive scorer's (..., T, S, A)
    work by another A x A matmul: the question is whether that buys quality.
    """

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int):
        super().__init__(query_dim, key_dim, hidden_dim)
        self.hidden = nn.Linear(hidden_dim, hidden_dim, bias=False)  # W2

    def prepare_keys(self, keys: Tensor) -> Tensor:
        return self.key_proj(keys)  # U k: (..., S, A); tanh as written, no factor 2

    def score_flops(self, t: int, s: int) -> int:
        a = self.v.in_features
        return super().score_flops(t, s) + 2 * t * s * a * a + t * s * a  # W2 and its tanh

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        q = self.query_proj(query).unsqueeze(-2)  # (..., T, 1, A)
        pairs = torch.tanh(q + keys.unsqueeze(-3))  # (..., T, S, A)
        return self.v(torch.tanh(self.hidden(pairs))).squeeze(-1)  # (..., T, S)


class DotScorer(Scorer):
    """Luong et al. (2015), eq. (8) "dot": score = q^T k. Needs query_dim == key_dim."""

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int):
        super().__init__(query_dim, key_dim, hidden_dim)
        if query_dim != key_dim:
            raise NMTError(f"{type(self).__name__} needs query_dim == key_dim, "
                           f"got {query_dim} and {key_dim}")

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        return query @ keys.transpose(-1, -2)  # (..., T, S)

    def score_flops(self, t: int, s: int) -> int:
        return 2 * t * s * self.query_dim


class GeneralScorer(Scorer):
    """Luong et al. (2015), eq. (8) "general": score = q^T W k (bilinear)."""

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int):
        super().__init__(query_dim, key_dim, hidden_dim)
        self.key_proj = nn.Linear(key_dim, query_dim, bias=False)  # W

    def prepare_keys(self, keys: Tensor) -> Tensor:
        return self.key_proj(keys)  # (..., S, Dq)

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        return query @ keys.transpose(-1, -2)  # (..., T, S)

    def score_flops(self, t: int, s: int) -> int:
        return 2 * s * self.key_dim * self.query_dim + 2 * t * s * self.query_dim


class ScaledDotScorer(DotScorer):
    """Vaswani et al. (2017), eq. (1): score = q^T k / sqrt(d).

    Without a request for weights, long inputs and CUDA tensors go through torch's fused
    ``scaled_dot_product_attention``, which never materialises the (T, S) weights. On CPU at
    sentence lengths the explicit matmul-softmax-matmul is faster: the fused kernel's
    backward took 3.4x as long for 120 sentences of 30 tokens in bf16 (docs/performance.md).
    """

    FUSED_CPU_MIN_SCORES = 512 * 512  # T * S from which the (T, S) weights cost real memory
    # Every fused kernel but cuDNN's, PyTorch's first choice on Hopper GPUs: it builds a graph
    # for each new (batch, length) shape, 0.64 s each on an H100 against 0.5 ms per call
    # after, and translation batches seldom repeat a shape: the default Transformer's training
    # step ran 5x slower with it (docs/performance.md).
    FUSED_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        return (query / math.sqrt(query.size(-1))) @ keys.transpose(-1, -2)  # (..., T, S)

    def attend(self, query, keys, values, mask, dropout=0.0, need_weights=True):
        long = query.size(-2) * keys.size(-2) >= self.FUSED_CPU_MIN_SCORES
        if need_weights or not (query.is_cuda or long):
            return super().attend(query, keys, values, mask, dropout, need_weights)
        with sdpa_kernel(self.FUSED_BACKENDS):
            context = F.scaled_dot_product_attention(
                query, keys, values, attn_mask=mask, dropout_p=dropout if self.training else 0.0
            )
        return context, None


class SymmetricScorer(ScaledDotScorer):
    """The "symmetric" variant people propose: scaled dot-product weights, then an extra
    projection of the attended values and a second 1/sqrt(d) outside the softmax,

        AttentionAlt(Q, K, V, W) = softmax(Q K^T / sqrt(d)) V W^T / sqrt(d).

    Inside a Transformer the output projection that follows can absorb W, so the variant
    differs from scaled_dot by the 1/sqrt(d) shrink of every attention output (and W's
    extra parameters); in the RNN the shrunk context feeds the recurrence directly.
    """

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int):
        super().__init__(query_dim, key_dim, hidden_dim)
        self.value_proj = nn.Linear(key_dim, key_dim, bias=False)  # W, applied as V W^T

    def score_flops(self, t: int, s: int) -> int:
        return super().score_flops(t, s) + 2 * t * self.key_dim * self.key_dim

    def attend(self, query, keys, values, mask, dropout=0.0, need_weights=True):
        context, weights = super().attend(query, keys, values, mask, dropout, need_weights)
        return self.value_proj(context) / math.sqrt(self.key_dim), weights  # (..., T, Dv)


SCORERS: dict[str, type[Scorer]] = {
    "additive": AdditiveScorer,
    "additive_deep": AdditiveDeepScorer,
    "dot": DotScorer,
    "general": GeneralScorer,
    "scaled_dot": ScaledDotScorer,
    "symmetric": SymmetricScorer,
}


def check_scorer(name: str) -> None:
    """A one-line error naming the valid scorers where ``name`` is none of them."""
    if name not in SCORERS:
        raise NMTError(f"unknown attention '{name}'; choose one of: {', '.join(SCORERS)}")


def build_scorer(name: str, query_dim: int, key_dim: int, hidden_dim: int) -> Scorer:
    check_scorer(name)
    return SCORERS[name](query_dim, key_dim, hidden_dim)


class MultiHeadAttention(nn.Module):
    """Vaswani et al. (2017), section 3.2.2: project to H heads, attend per head with the
    configured scorer, concatenate, project back. Works incrementally: ``project_keys``
    gives the per-head (prepared keys, values) of new positions, which a decoder can cache
    and concatenate step by step."""

    def __init__(self, scorer: str, d_model: int, heads: int, dropout: float):
        super().__init__()
        if d_model % heads:
            raise NMTError(f"d_model {d_model} is not divisible by heads {heads}")
        self.heads, self.head_dim, self.dropout = heads, d_model // heads, dropout
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.scorer = build_scorer(scorer, self.head_dim, self.head_dim, self.head_dim)

    def _split(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def project_keys(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S, D) -> prepared keys (B, H, S, D') and values (B, H, S, Dh), contiguous:
        the per-head view is strided, and matmul would copy it again at every decoding step."""
        keys = self.scorer.prepare_keys(self._split(self.k_proj(x)))
        return keys.contiguous(), self._split(self.v_proj(x)).contiguous()

    def forward(
        self,
        query: Tensor,
        keys_values: tuple[Tensor, Tensor],
        mask: Tensor | None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """(B, T, D), output of ``project_keys``, mask (B, 1|T, S) -> (B, T, D), weights
        (B, H, T, S) or None."""
        context, weights = self.attend_projected(self.q_proj(query), keys_values, mask, need_weights)
        return self.out_proj(context), weights

    def attend_projected(
        self, query: Tensor, keys_values: tuple[Tensor, Tensor], mask: Tensor | None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """``forward`` between the projections: queries already through ``q_proj`` (B, T, D)
        -> the heads' contexts concatenated (B, T, D), before ``out_proj``, and the weights.
        For callers that change the rows between the projections (beam search's padding)."""
        keys, values = keys_values
        q = self._split(query)  # (B, H, T, Dh)
        mask = mask.unsqueeze(1) if mask is not None else None  # (B, 1, 1|T, S)
        dropout = self.dropout if self.training else 0.0
        context, weights = self.scorer.attend(q, keys, values, mask, dropout, need_weights)
        b, _, t, _ = context.shape
        return context.transpose(1, 2).reshape(b, t, -1), weights  # (B, T, D)

    def flops(self, t: int, s: int) -> int:
        """Forward FLOPs for one sentence: T queries over S keys, four projections."""
        d = self.heads * self.head_dim
        return 2 * d * d * (2 * t + 2 * s) + self.heads * self.scorer.flops(t, s)
