#!/bin/bash
# The Transformer's 15-minute no-flag run at 00a6cdd (the short-run dropout rule), de->en,
# 2026-11-30 04:24 UTC, AMD EPYC family 25 model 1 (Zen 3), 2 cores, fp32 as auto chose, alone.
export HF_HUB_OFFLINE=1
nmt train --config configs/transformer.yaml --max-time 00:15:00 --run-dir checkpoints/transformer_15min_short
nmt evaluate --checkpoint checkpoints/transformer_15min_short
nmt bench decode --checkpoint checkpoints/transformer_15min_short --beam 1,5
