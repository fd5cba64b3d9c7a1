"""nmt: neural machine translation with pluggable attention.

Shape notation used in every docstring and comment:

    B  batch size (sentences; during beam search: sentences x beam)
    K  beam size
    S  source length (pieces)           T  target length (pieces)
    D  model / hidden size              A  additive-attention hidden size
    H  attention heads                  Dh per-head size (D / H)
    V  vocabulary size (one joint SentencePiece vocabulary for both languages)

Masks are boolean and True where a position may be attended to (a real token).
"""

__version__ = "0.1.0"
