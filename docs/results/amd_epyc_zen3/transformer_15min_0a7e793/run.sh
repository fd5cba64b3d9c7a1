#!/bin/bash
set -x
export HF_HUB_OFFLINE=1 PATH=$PWD/.venv/bin:$PATH
R=checkpoints/transformer_15min_head
rm -rf $R
nmt train --config configs/transformer.yaml --max-time 00:15:00 --run-dir $R
nmt evaluate --checkpoint $R --beam 5
nmt bench decode --checkpoint $R --precision auto --beam 1,5
