"""Bahdanau et al. (2015), "Neural Machine Translation by Jointly Learning to Align and Translate".

Encoder: a bidirectional GRU (or LSTM) reads the source; annotation h_j = [->h_j ; <-h_j]
(section 3.2). Decoder: at step i the previous state s_{i-1} attends over the annotations
(any scorer) to get the context c_i (eq. 5-6); s_i = GRU([y_{i-1} ; c_i], s_{i-1}) (eq. 4);
a deep output t_i = tanh(W [s_i ; c_i ; y_{i-1}]) (appendix A.2.2, tanh in place of maxout)
is scored against the shared, tied embedding matrix.

Sizes: ``hidden_size`` D is both the decoder state and the annotation size (each encoder
direction has D/2 units), so every scorer, dot-product included, sees queries and keys of
one size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nmt.attention import build_scorer
from nmt.data.tokenizer import PAD
from nmt.dropout import Dropout
from nmt.errors import NMTError
from nmt.models.autocast import in_autocast_dtype
from nmt.models.base import Beams, beam_rows, beams_as_queries, model_option

RNN_TYPES = {"gru": (nn.GRU, nn.GRUCell), "lstm": (nn.LSTM, nn.LSTMCell)}
# "scaled": embeddings drawn from N(0, 1/E) and multiplied by sqrt(E) on the way in, as in the
# Transformer. "unit": nn.Embedding's N(0, 1), unscaled, as before 2026-11-25 (the study's cells).
EMBED_INITS = ("scaled", "unit")


class RNNModel(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        attention: str = "additive",
        emb_dim: int = 256,
        hidden_size: int = 512,
        attention_dim: int = 512,
        encoder_layers: int = 1,
        rnn_type: str = "gru",
        dropout: float = 0.3,
        max_positions: int = 1024,
        embed_init: str = "scaled",
    ):
        super().__init__()
        if embed_init not in EMBED_INITS:
            raise NMTError(f"unknown embed_init '{embed_init}'; choose one of: "
                           f"{', '.join(EMBED_INITS)}")
        if rnn_type not in RNN_TYPES:
            raise NMTError(f"unknown rnn_type '{rnn_type}'; choose one of: {', '.join(RNN_TYPES)}")
        rnn, cell = RNN_TYPES[rnn_type]
        self.is_lstm = rnn_type == "lstm"
        self.max_positions = max_positions
        self.embed = nn.Embedding(vocab_size, emb_dim, padding_idx=PAD)
        self.encoder = rnn(
            emb_dim,
            hidden_size // 2,
            num_layers=encoder_layers,
            batch_first=True,
            bidirectional=True,
            dropout=dropout if encoder_layers > 1 else 0.0,
        )
        self.bridge = nn.Linear(hidden_size, hidden_size)
        self.scorer = build_scorer(attention, hidden_size, hidden_size, attention_dim)
        self.cell = cell(emb_dim + hidden_size, hidden_size)
        self.deep_out = nn.Linear(2 * hidden_size + emb_dim, emb_dim)
        self.out_bias = nn.Parameter(torch.zeros(vocab_size))
        self.drop = Dropout(dropout)
        self._init_embedding(embed_init)

    @classmethod
    def typical_matmuls(cls, options: dict, vocab_size: int, tokens: int) -> list[tuple[int, int, int]]:
        """The (M, K, N) matmuls that dominate a training step over ``tokens`` rows: the
        attention's projection of the states, the decoder cell's gates over [y; c] and the
        output layer, tied to the embedding (what ``auto`` precision times)."""
        emb, hidden, attention = (model_option(cls, options, name)
                                  for name in ("emb_dim", "hidden_size", "attention_dim"))
        gates = 4 if model_option(cls, options, "rnn_type") == "lstm" else 3
        return [(tokens, hidden, attention), (tokens, emb + hidden, gates * hidden),
                (tokens, emb, vocab_size)]

    def _init_embedding(self, embed_init: str) -> None:
        """The output layer is tied to the embedding, so the embedding's scale is the initial
        logits' scale. Under N(0, 1), logits over 256-dim tanh features have std ~6 and the
        first loss is ~22 nats against ln V ~ 9 for V = 8000; the first few hundred updates
        then go to shrinking them. "scaled" draws from N(0, 1/E), so logits start with std
        below 1, and multiplies looked-up vectors by sqrt(E) so the recurrent layers still
        see unit-variance inputs. The factor is a buffer: checkpoints carry it."""
        scaled = embed_init == "scaled"
        if scaled:
            nn.init.normal_(self.embed.weight, std=self.embed.embedding_dim**-0.5)
            with torch.no_grad():
                self.embed.weight[PAD].zero_()
        self.register_buffer("emb_scale",
                             torch.tensor(self.embed.embedding_dim**0.5 if scaled else 1.0))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Checkpoints from before embed_init have no emb_scale: they were trained unscaled.
        state_dict.setdefault(prefix + "emb_scale", torch.tensor(1.0))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def set_dropout(self, p: float) -> None:
        """``dropout`` (embeddings, decoder state and output) from now on; the dropout
        between stacked encoder layers keeps its value."""
        self.drop.p = p

    def _embed(self, tokens: Tensor) -> Tensor:
        """(...) token ids -> (..., E) scaled embeddings."""
        return self.embed(tokens) * self.emb_scale

    def encode(self, src: Tensor, src_mask: Tensor) -> dict[str, Tensor]:
        """(B, S) -> annotations (B, S, D), their prepared keys, the mask and s_0 (B, D)."""
        lengths = src_mask.sum(1).cpu()
        packed = pack_padded_sequence(
            self.drop(self._embed(src)), lengths, batch_first=True, enforce_sorted=False
        )
        out, final = self.encoder(packed)
        annotations, _ = pad_packed_sequence(out, batch_first=True, total_length=src.size(1))
        annotations = in_autocast_dtype(annotations)
        final = self._hidden(final)  # (2 * layers, B, D/2)
        # s_0 = tanh(W [->h_S ; <-h_1]) from the top layer's two directions.
        init = torch.tanh(self.bridge(torch.cat([final[-2], final[-1]], dim=-1)))  # (B, D)
        return {
            "annotations": annotations,
            "keys": self.scorer.prepare_keys(annotations),  # once per sentence
            "mask": src_mask.unsqueeze(1),  # (B, 1, S)
            "init": init,
        }

    def init_state(self, memory: dict[str, Tensor]) -> Tensor | tuple[Tensor, Tensor]:
        init = memory["init"]
        return (init, torch.zeros_like(init)) if self.is_lstm else init

    def _hidden(self, state) -> Tensor:
        """The hidden part of a GRU's or LSTM's state: h, not an LSTM's cell (e.g. s_i (B, D))."""
        return state[0] if self.is_lstm else state

    def _step(
        self, prev_emb: Tensor, state, memory: dict[str, Tensor], need_attn: bool,
        beams: Beams | None = None,
    ) -> tuple[Tensor | tuple[Tensor, Tensor], Tensor, Tensor | None]:
        """One recurrence step: (B, E) previous embedding -> new state, c_i (B, D), attn (B, S)."""
        query = self._hidden(state).unsqueeze(1)  # s_{i-1}: (B, 1, D)
        n = memory["mask"].size(0)  # sentences, K beam slots each (see models.base)
        context, attn = self.scorer.attend(beams_as_queries(query, n, beams), memory["keys"],
                                           memory["annotations"], memory["mask"],
                                           need_weights=need_attn)  # (n, K, D), (n, K, S)
        context = beam_rows(context.flatten(0, 1), beams)  # c_i: (B, D)
        state = self.cell(torch.cat([prev_emb, context], dim=-1), state)
        return state, context, beam_rows(attn.flatten(0, 1), beams) if attn is not None else None

    def _deep_output(self, s: Tensor, context: Tensor, prev_emb: Tensor) -> Tensor:
        """t_i = tanh(W [s_i ; c_i ; y_{i-1}]): (..., D), (..., D), (..., E) -> (..., E).
        It feeds the output layer only, not the recurrence, so teacher forcing takes it for
        all positions at once: one large matmul instead of T small ones (1.01-1.04x faster
        training steps, docs/performance.md)."""
        t = torch.tanh(self.deep_out(torch.cat([self.drop(s), context, prev_emb], dim=-1)))
        return self.drop(t)

    def _logits(self, t: Tensor) -> Tensor:
        return F.linear(t, self.embed.weight, self.out_bias)  # tied output layer

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher forcing: (B, S), (B, S), (B, T) -> logits (B, T, V)."""
        memory = self.encode(src, src_mask)
        state = self.init_state(memory)
        embedded = self.drop(self._embed(tgt_in))  # (B, T, E)
        states, contexts = [], []
        # unbind, not embedded[:, i]: the backward of each index would fill a (B, T, E) zero
        # tensor for its one position and add it to the others (T times per step).
        for prev_emb in embedded.unbind(1):  # T x (B, E)
            state, context, _ = self._step(prev_emb, state, memory, need_attn=False)
            states.append(self._hidden(state))
            contexts.append(context)
        t = self._deep_output(torch.stack(states, 1), torch.stack(contexts, 1), embedded)
        return self._logits(t)  # (B, T, V)

    def forward_flops(self, src: Tensor, tgt_in: Tensor) -> int:
        """Analytic forward FLOPs of ``forward`` on this padded batch (2 per multiply-add). The
        encoder runs packed, over each sentence's own tokens; the attention and the decoder
        run over the padded (B, S) and (B, T)."""
        b, s = src.shape
        t = tgt_in.size(1)
        e, d, v = self.embed.embedding_dim, self.cell.hidden_size, self.embed.num_embeddings
        gates = 4 if self.is_lstm else 3
        h = d // 2
        inputs = [e] + [d] * (self.encoder.num_layers - 1)
        per_token = sum(2 * 2 * gates * (i * h + h * h) for i in inputs)  # two directions
        encoder = per_token * int((src != PAD).sum())
        keys = self.scorer.score_flops(0, s)  # prepare_keys, once per sentence
        step = (self.scorer.flops(1, s) - self.scorer.score_flops(0, s)
                + 2 * gates * ((e + d) * d + d * d) + 2 * (2 * d + e) * e + 2 * e * v)
        return encoder + b * (2 * d * d + keys + t * step)

    def decode_step(self, prev: Tensor, state, memory, need_attn: bool = False,
                    beams: Beams | None = None):
        """(B,) previous tokens -> log-probs (B, V), new state, attention (B, S) or None."""
        prev_emb = self._embed(prev)
        state, context, attn = self._step(prev_emb, state, memory, need_attn, beams)
        t = self._deep_output(self._hidden(state), context, prev_emb)
        # fp32 scores, also under bf16 autocast: casting as log_softmax reads takes 0.8x the
        # time of a .float() copy first
        return torch.log_softmax(self._logits(t), dim=-1, dtype=torch.float32), state, attn
