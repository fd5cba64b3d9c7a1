"""Learning-rate schedules as functions of the step."""

import math

import pytest

from nmt.config import load_config
from nmt.errors import NMTError
from nmt.training import train, warmup_cosine


def test_cosine_warms_up_then_anneals_to_the_floor_at_the_budget():
    factor = warmup_cosine(warmup=10, total=110, floor=0.1)
    assert factor(0) == pytest.approx(0.1) and factor(9) == pytest.approx(1.0)
    assert factor(10) == pytest.approx(1.0)  # the peak, right after warm-up
    assert factor(60) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))  # halfway
    assert factor(110) == pytest.approx(0.1) and factor(500) == pytest.approx(0.1)
    steps = [factor(s) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(steps, steps[1:]))  # never rises after the peak


def test_cosine_needs_a_step_budget():
    config = load_config("configs/transformer.yaml", ["optim.schedule=cosine"])
    with pytest.raises(NMTError, match="set trainer.max_steps"):
        train(config)
