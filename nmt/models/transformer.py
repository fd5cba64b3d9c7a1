"""Vaswani et al. (2017), "Attention Is All You Need", with any scorer in every attention.

Dropout as in section 5.4: on every sublayer output and on the embeddings (``dropout``);
dropout on attention weights and inside the feed-forward layer is optional (0 by default,
and cheap to keep off: drawing those masks with torch's dropout cost a quarter of a CPU
training step; ``nmt.dropout`` draws every mask here at a fraction of that cost).
Pre-norm residual blocks by default (x + f(LN(x)); post-norm LN(x + f(x)) as in the paper
is one flag away), sinusoidal positions (section 3.5), and one embedding matrix shared by
source, target and the output layer (section 3.4), possible because the vocabulary is joint.
Decoding is incremental: each layer caches the prepared keys and values of the positions
generated so far (``nmt.models.cache``), and the encoder-side keys/values of every layer
are computed once.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.attention import MultiHeadAttention
from nmt.data.tokenizer import PAD
from nmt.dropout import Dropout
from nmt.models.autocast import in_autocast_dtype
from nmt.models.base import Beams, beam_rows, beams_as_queries, model_option
from nmt.models.cache import SelfAttentionCache, batch_major


def sinusoids(length: int, dim: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...): (length, dim), on the
    default device. Computed on the CPU: on the meta device (``build_shape_model``) torch
    computes these in Python behind torch._dynamo, whose import is seconds."""
    position = torch.arange(length, device="cpu").unsqueeze(1)
    frequency = torch.exp(torch.arange(0, dim, 2, device="cpu") * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim, device="cpu")
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency)
    return table.to(torch.empty(()).device)  # the default device, a `with torch.device` one too


class Residual(nn.Module):
    """A sublayer with its layer norm and dropout, pre-norm or post-norm."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.drop = Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(self, x: Tensor, sublayer) -> Tensor:
        if self.pre_norm:
            return x + self.drop(sublayer(self.norm(x)))
        return self.norm(x + self.drop(sublayer(x)))


def feed_forward(d_model: int, ff_dim: int, dropout: float) -> nn.Module:
    """Section 3.3: FFN(x) = max(0, x W1 + b1) W2 + b2."""
    return nn.Sequential(
        nn.Linear(d_model, ff_dim), nn.ReLU(), Dropout(dropout), nn.Linear(ff_dim, d_model)
    )


class EncoderLayer(nn.Module):
    def __init__(self, attention: str, d_model: int, heads: int, ff_dim: int, dropout: float,
                 attention_dropout: float, ff_dropout: float, pre_norm: bool):
        super().__init__()
        self.self_attn = MultiHeadAttention(attention, d_model, heads, attention_dropout)
        self.ff = feed_forward(d_model, ff_dim, ff_dropout)
        self.res_attn = Residual(d_model, dropout, pre_norm)
        self.res_ff = Residual(d_model, dropout, pre_norm)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """(B, S, D), mask (B, 1, S) -> (B, S, D)."""
        def self_attend(h: Tensor) -> Tensor:
            h = in_autocast_dtype(h)  # once for the three projections
            return self.self_attn(h, self.self_attn.project_keys(h), mask)[0]

        x = self.res_attn(x, self_attend)
        return self.res_ff(x, self.ff)


class DecoderLayer(nn.Module):
    def __init__(self, attention: str, d_model: int, heads: int, ff_dim: int, dropout: float,
                 attention_dropout: float, ff_dropout: float, pre_norm: bool):
        super().__init__()
        self.self_attn = MultiHeadAttention(attention, d_model, heads, attention_dropout)
        self.cross_attn = MultiHeadAttention(attention, d_model, heads, attention_dropout)
        self.ff = feed_forward(d_model, ff_dim, ff_dropout)
        self.res_self = Residual(d_model, dropout, pre_norm)
        self.res_cross = Residual(d_model, dropout, pre_norm)
        self.res_ff = Residual(d_model, dropout, pre_norm)

    def forward(self, x, cross_kv, src_mask, self_mask, cache: SelfAttentionCache | None = None,
                index: int = 0, need_attn: bool = False, beams: Beams | None = None):
        """x (B, T, D); cross_kv from ``cross_attn.project_keys``; ``cache`` when decoding (x
        holds one new position; this is layer ``index`` of it) or None (teacher forcing: x
        holds every position); ``beams`` as in ``models.base`` -> (B, T, D), this layer's
        (keys, values) of all positions, time-major (T, B, H, Dh), when decoding, cross-attn
        weights (B, H, T, S) or None."""
        cached = {"kv": None}

        def self_attend(h: Tensor) -> Tensor:
            h = in_autocast_dtype(h)  # once for the three projections
            keys, values = self.self_attn.project_keys(h)  # (B, H, T, .)
            if cache is not None:  # incremental: the earlier positions, then this one
                cached["kv"] = cache.extend(index, keys, values)
                keys, values = (batch_major(kv) for kv in cached["kv"])
            return self.self_attn(h, (keys, values), self_mask)[0]

        def cross_attend(h: Tensor) -> Tensor:
            # The projections run on the batch's rows only, the attention on the sentences'
            # K beam slots each (models.base): pruned slots cost no projection work.
            n, t = src_mask.size(0), h.size(1)
            queries = beams_as_queries(self.cross_attn.q_proj(h), n, beams)  # (n, K * T, D)
            context, attn = self.cross_attn.attend_projected(queries, cross_kv, src_mask, need_attn)
            if attn is not None:  # (n, H, K * T, S) -> (n * K, H, T, S)
                attn = beam_rows(attn.unflatten(2, (-1, t)).transpose(1, 2).flatten(0, 1), beams)
            cached["attn"] = attn
            context = beam_rows(context.reshape(-1, t, context.size(-1)), beams)  # (B, T, D)
            return self.cross_attn.out_proj(context)

        x = self.res_self(x, self_attend)
        x = self.res_cross(x, cross_attend)
        return self.res_ff(x, self.ff), cached["kv"], cached["attn"]


class TransformerModel(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        attention: str = "scaled_dot",
        d_model: int = 256,
        heads: int = 4,
        ff_dim: int = 1024,
        encoder_layers: int = 3,
        decoder_layers: int = 3,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        ff_dropout: float = 0.0,
        pre_norm: bool = True,
        max_positions: int = 512,
    ):
        super().__init__()
        self.d_model, self.max_positions = d_model, max_positions
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=PAD)
        nn.init.normal_(self.embed.weight, std=d_model**-0.5)
        self.register_buffer("positions", sinusoids(max_positions, d_model), persistent=False)
        self.drop = Dropout(dropout)
        args = (attention, d_model, heads, ff_dim, dropout, attention_dropout, ff_dropout, pre_norm)
        self.encoder = nn.ModuleList(EncoderLayer(*args) for _ in range(encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(*args) for _ in range(decoder_layers))
        # Pre-norm stacks end un-normalised, so each gets a final norm (identity for post-norm).
        self.enc_norm = nn.LayerNorm(d_model) if pre_norm else nn.Identity()
        self.dec_norm = nn.LayerNorm(d_model) if pre_norm else nn.Identity()

    @classmethod
    def typical_matmuls(cls, options: dict, vocab_size: int, tokens: int) -> list[tuple[int, int, int]]:
        """The (M, K, N) matmuls that dominate a training step over ``tokens`` rows: a
        projection, the feed-forward layer and the output layer (what ``auto`` precision times)."""
        d, ff = model_option(cls, options, "d_model"), model_option(cls, options, "ff_dim")
        return [(tokens, d, d), (tokens, d, ff), (tokens, d, vocab_size)]

    def set_dropout(self, p: float) -> None:
        """The residual and embedding dropout (``dropout``) from now on; attention and
        feed-forward dropout keep theirs."""
        for module in self.modules():
            if isinstance(module, Residual):
                module.drop.p = p
        self.drop.p = p

    def _embed(self, tokens: Tensor, start: int = 0) -> Tensor:
        """(B, T) -> (B, T, D): scaled embedding + positions start..start+T-1."""
        positions = self.positions[start : start + tokens.size(1)]
        return self.drop(self.embed(tokens) * math.sqrt(self.d_model) + positions)

    def encode(self, src: Tensor, src_mask: Tensor) -> dict:
        """(B, S) -> per-decoder-layer cross keys/values (computed once) and the mask."""
        mask = src_mask.unsqueeze(1)  # (B, 1, S)
        x = self._embed(src)
        for layer in self.encoder:
            x = layer(x, mask)
        x = in_autocast_dtype(self.enc_norm(x))  # once for the decoder layers' projections
        return {"cross": [layer.cross_attn.project_keys(x) for layer in self.decoder], "mask": mask}

    def init_state(self, memory: dict) -> SelfAttentionCache:
        return SelfAttentionCache()

    def _decode(self, x: Tensor, memory: dict, self_mask, cache: SelfAttentionCache | None,
                need_attn: bool, beams: Beams | None = None):
        """Decoder stack -> logits (B, T, V), the grown cache (when decoding, else None),
        cross-attention weights of every layer (B, L, H, T, S) or None."""
        attns, layers = [], []
        for index, (layer, cross_kv) in enumerate(zip(self.decoder, memory["cross"])):
            x, kv, attn = layer(x, cross_kv, memory["mask"], self_mask, cache, index, need_attn,
                                beams)
            layers.append(kv)
            attns.append(attn)
        attn = torch.stack(attns, 1) if need_attn else None
        grown = SelfAttentionCache(tuple(layers)) if cache is not None else None
        return F.linear(self.dec_norm(x), self.embed.weight), grown, attn

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher forcing: (B, S), (B, S), (B, T) -> logits (B, T, V)."""
        memory = self.encode(src, src_mask)
        t = tgt_in.size(1)
        causal = torch.ones(t, t, dtype=torch.bool, device=src.device).tril().unsqueeze(0)
        logits, _, _ = self._decode(self._embed(tgt_in), memory, causal, None, False)
        return logits

    def forward_flops(self, src: Tensor, tgt_in: Tensor) -> int:
        """Analytic forward FLOPs of ``forward`` on this padded batch (2 per multiply-add)."""
        b, s = src.shape
        t = tgt_in.size(1)
        ff = 4 * self.d_model * self.encoder[0].ff[0].out_features  # two linears, per token
        enc = sum(layer.self_attn.flops(s, s) + ff * s for layer in self.encoder)
        dec = sum(layer.self_attn.flops(t, t) + layer.cross_attn.flops(t, s) + ff * t
                  for layer in self.decoder)
        output = 2 * t * self.d_model * self.embed.num_embeddings
        return b * (enc + dec + output)

    def decode_step(self, prev: Tensor, state: SelfAttentionCache, memory: dict,
                    need_attn: bool = False, beams: Beams | None = None):
        """(B,) -> log-probs (B, V), the cache grown by one position, and the
        cross-attention of every layer and head (B, L, H, S), or None."""
        x = self._embed(prev.unsqueeze(1), start=state.length)  # (B, 1, D)
        logits, state, attn = self._decode(x, memory, None, state, need_attn, beams)
        attn = attn.squeeze(3) if attn is not None else None  # (B, L, H, S)
        # fp32 scores, also under bf16 autocast: casting as log_softmax reads takes 0.8x the
        # time of a .float() copy first
        return torch.log_softmax(logits.squeeze(1), dim=-1, dtype=torch.float32), state, attn
