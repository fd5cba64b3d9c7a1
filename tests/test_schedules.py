"""Learning-rate schedules as functions of the step."""

import math

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Timer

from nmt.cli import main
from nmt.config import load_config
from nmt.errors import NMTError
from nmt.training import budget_horizon, train, warmup_cosine

from .conftest import tiny_train_args, write_corpus


def test_cosine_warms_up_then_anneals_to_the_floor_at_the_budget():
    factor = warmup_cosine(warmup=10, horizon=lambda step: 110, floor=0.1)
    assert factor(0) == pytest.approx(0.1) and factor(9) == pytest.approx(1.0)
    assert factor(10) == pytest.approx(1.0)  # the peak, right after warm-up
    assert factor(60) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))  # halfway
    assert factor(110) == pytest.approx(0.1) and factor(500) == pytest.approx(0.1)
    steps = [factor(s) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(steps, steps[1:]))  # never rises after the peak


def test_cosine_needs_a_budget():
    config = load_config("configs/transformer.yaml", ["optim.schedule=cosine",
                                                      "trainer.max_epochs=-1"])
    with pytest.raises(NMTError, match="set trainer.max_steps, trainer.max_epochs or --max-time"):
        train(config)


def test_a_time_budget_ends_where_the_speed_so_far_reaches_it(monkeypatch):
    trainer = L.Trainer(max_steps=400, max_time="00:00:10:00", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False)
    timer = next(c for c in trainer.callbacks if isinstance(c, Timer))
    monkeypatch.setattr(timer, "time_elapsed", lambda stage="train": 120.0)  # 2 of 10 minutes
    horizon = budget_horizon(trainer)
    assert horizon(50) == pytest.approx(250)  # 50 steps in 2 minutes: 250 in 10
    assert horizon(100) == 400  # the step budget comes first
    untimed = L.Trainer(max_steps=400, logger=False, enable_checkpointing=False)
    assert budget_horizon(untimed)(100) == 400
    endless = L.Trainer(max_epochs=-1, max_time="00:00:10:00", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False)
    timer = next(c for c in endless.callbacks if isinstance(c, Timer))
    monkeypatch.setattr(timer, "time_elapsed", lambda stage="train": 120.0)
    assert budget_horizon(endless)(50) == pytest.approx(250)  # no epoch limit: time alone


def test_cosine_over_epochs_reaches_its_floor_at_the_last_step(tmp_path):
    files = write_corpus(tmp_path)
    run = tmp_path / "run"
    assert main([*tiny_train_args(files, run, tmp_path / "data", epochs=2),
                 "optim.schedule=cosine", "optim.warmup_steps=2", "optim.min_lr=1e-5",
                 "trainer.early_stopping_patience=10"]) == 0
    state = torch.load(run / "last.ckpt", map_location="cpu", weights_only=False)
    assert state["optimizer_states"][0]["param_groups"][0]["lr"] == pytest.approx(1e-5)
