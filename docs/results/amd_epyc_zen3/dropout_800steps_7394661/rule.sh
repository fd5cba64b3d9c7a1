#!/bin/bash
# The short-run rule at 800 updates (3.3 epochs): dropout 0.1 (model.dropout) for the first
# epoch, then 0.0 (optim.short_run_dropout, budget under optim.short_run_epochs 4), code 3f1ef26;
# otherwise as run.sh (`bash rule.sh CORE SEED`, two at a time, one core and one thread each).
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
name=exp_r0.0_s$2
taskset -c $1 nmt train --config configs/transformer.yaml --run-dir checkpoints/$name \
  --seed $2 --trainer.max_steps 800 --optim.short_run_dropout 0.0 --optim.short_run_epochs 4
taskset -c $1 nmt evaluate --checkpoint checkpoints/$name --split test --beam 5
taskset -c $1 nmt evaluate --checkpoint checkpoints/$name --split val --beam 5
