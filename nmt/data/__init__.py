"""Data pipeline: corpus -> joint tokenizer -> cached ids -> length-bucketed batches."""
