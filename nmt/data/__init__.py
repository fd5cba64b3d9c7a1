"""Data pipeline: corpus (checked lines) -> prepare (joint SentencePiece, memory-mapped ids,
cached once) -> length-bucketed batches."""
