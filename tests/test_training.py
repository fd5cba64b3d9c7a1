"""Training pieces that need no corpus: the weight EMA's averaging window."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

from nmt.training import ramped_ema


@pytest.mark.parametrize("steps", [100, 1000, 10000])
def test_ema_spans_about_the_last_tenth_of_the_steps(steps):
    """Fed the weights w_t = t, the average lags the newest weight by a tenth of the run or
    so, whatever the run's length: it forgets the initialisation and early steps."""
    model = nn.Linear(1, 1, bias=False)
    averaged = AveragedModel(model, avg_fn=ramped_ema(0.99999))
    with torch.no_grad():
        for t in range(1, steps + 1):
            model.weight.fill_(t)
            averaged.update_parameters(model)
    lag = steps - averaged.module.weight.item()
    assert 0.05 * steps < lag < 0.2 * steps


def test_ema_decay_caps_the_window():
    model = nn.Linear(1, 1, bias=False)
    averaged = AveragedModel(model, avg_fn=ramped_ema(0.9))  # window ~10 steps
    with torch.no_grad():
        for t in range(1, 1001):
            model.weight.fill_(t)
            averaged.update_parameters(model)
    assert 5 < 1000 - averaged.module.weight.item() < 15
