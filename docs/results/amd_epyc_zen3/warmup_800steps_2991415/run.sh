#!/bin/bash
# The warm-up comparison at 800 updates (2026-11-29, AMD EPYC family 25 model 1, Zen 3, fp32).
# Two runs at a time, each pinned to one core with one thread (`bash run.sh CORE WARMUP SEED`):
#   run.sh 0 400 1 & run.sh 1 200 1; run.sh 0 600 1 & run.sh 1 400 2; run.sh 0 200 2 & run.sh 1 600 2
# The number of updates is fixed, so the runs' speed (two at a time) does not move the scores.
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
name=exp_w$2_s$3
taskset -c $1 nmt train --config configs/transformer.yaml --run-dir checkpoints/$name \
  --seed $3 --trainer.max_steps 800 --optim.warmup_steps $2
taskset -c $1 nmt evaluate --checkpoint checkpoints/$name --split test --beam 5
# then: sacrebleu REF -i checkpoints/exp_w400_sN/eval/test.beam5.hyp (the others) -m bleu chrf --paired-bs -f text
