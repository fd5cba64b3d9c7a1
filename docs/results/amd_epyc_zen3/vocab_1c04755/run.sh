#!/bin/bash
# The joint SentencePiece vocabulary's size against time to BLEU: the default Transformer with
# --max-time 00:15:00 at data.vocab_size 8000 (the default) and 4000, alternating so that both
# see the same hours of a noisy host; each run's val and test BLEU (beam 5, the run's weights).
# Run from the repository root: bash docs/results/amd_epyc_zen3/vocab_1c04755/run.sh [RUN...]
# with RUN like v8000_1 (vocabulary 8000, first run); default: v8000_1 v4000_1 v8000_2 v4000_2.
set -x
OUT=docs/results/amd_epyc_zen3/vocab_1c04755
export HF_HUB_OFFLINE=1 PATH=$PWD/.venv/bin:$PATH
for name in ${@:-v8000_1 v4000_1 v8000_2 v4000_2}; do
  vocab=${name%_*}; vocab=${vocab#v}
  nmt train --config configs/transformer.yaml --max-time 00:15:00 --run-dir checkpoints/vocab_$name \
      --data.vocab_size $vocab
  for split in val test; do nmt evaluate --checkpoint checkpoints/vocab_$name --split $split --beam 5; done
  mkdir -p $OUT/$name && cp checkpoints/vocab_$name/train_stats.json \
      checkpoints/vocab_$name/logs/version_0/metrics.csv checkpoints/vocab_$name/eval/* $OUT/$name/
done
