"""Decoding's precision auto on CUDA (2026-11-30, after the H200 walk at 2cdf6a6 found bf16
decoding of the default Transformer at 0.72x fp32): the probe on each default model, fresh
weights (the timing does not depend on them), at the beams and batches the commands use."""
import sys

import torch

from nmt import precision
from nmt.config import load_config
from nmt.models import build_model

precision.CACHE = precision.Path("/tmp/nmt_probe/precision.json")
for cfg in ("transformer", "rnn_bahdanau"):
    config = load_config(f"configs/{cfg}.yaml")
    model = build_model(config.model, config.data.vocab_size).cuda().eval()
    for beam, sentences in ((5, None), (1, None), (5, 32)):
        choice = precision.decoding_precision(config, model, "cuda", beam=beam, sentences=sentences)
        print(f"{cfg} beam {beam} sentences {sentences or 'batch'}: {choice.precision} ({choice.reason})")
    again = precision.decoding_precision(config, model, "cuda")
    print(f"{cfg} again: {again.precision} measured={again.measured}")
    sys.stdout.flush()
