"""Learning-rate schedules, by name (``optim.schedule``), and the step at which a budget ends.

Each schedule is a factor of the peak learning rate ``optim.lr`` as a function of the
optimizer step, except ``plateau``, which lowers the rate when validation BLEU stops rising.
A new schedule is one function and one entry in ``SCHEDULERS``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from nmt.config import OptimConfig

if TYPE_CHECKING:  # Lightning is imported where a schedule runs: the names are checked without it
    import lightning as L


def inverse_sqrt(warmup: int):
    """Vaswani et al. (2017) eq. (3), relative to the peak lr: linear warm-up, then 1/sqrt(step)."""
    return lambda step: min((step + 1) / warmup, (warmup / (step + 1)) ** 0.5)


def warmup_cosine(warmup: int, horizon: Callable[[int], float], floor: float):
    """Linear warm-up, then half a cosine from the peak lr down to ``floor`` x peak at the
    budget's last update, ``horizon(step)`` (Loshchilov & Hutter 2017, one cycle): for a fixed
    budget, where annealing to its end pays more than a schedule that never ends.

    Step s (from 0, as LambdaLR counts) takes update s + 1, as ``inverse_sqrt`` counts: the
    peak is update ``warmup`` (the first with no warm-up), and the budget's last update,
    ``horizon`` (step horizon - 1), trains at the floor. Counted from step ``warmup`` instead,
    the peak was held for two updates and the floor came one step after the last."""

    def factor(step: int) -> float:
        update = step + 1
        if update <= warmup:
            return update / warmup
        peak = max(warmup, 1)
        progress = min(1.0, (update - peak) / max(1.0, horizon(step) - peak))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def steps_per_epoch(trainer: L.Trainer) -> float:
    """Optimizer steps in one epoch of the running fit: Lightning also steps on an epoch's last
    batch where it ends a partial accumulation."""
    batches = trainer.num_training_batches  # inf until the fit has its loader
    return math.ceil(batches / trainer.accumulate_grad_batches) if math.isfinite(batches) else batches


def budget_horizon(trainer: L.Trainer) -> Callable[[int], float]:
    """The step at which training will end, as known at ``step``: ``max_steps`` or the steps of
    ``max_epochs`` epochs, whichever comes first (as Lightning stops), or, sooner, the step that
    ``max_time`` reaches at the speed so far (``step`` x duration / time elapsed, validation
    included; the Timer's elapsed time survives a resume). A time budget thus anneals to its
    end, whatever the machine's speed.

    Read when the schedule steps, from the loop's own counts: ``estimated_stepping_batches``
    would build a training loader here, and drawing its seeds would shift the dropout masks of
    a resumed run against an uninterrupted one."""
    from lightning.pytorch.callbacks import Timer

    timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
    duration = None if timer is None or timer.time_remaining() is None \
        else timer.time_elapsed() + timer.time_remaining()

    def horizon(step: int) -> float:
        steps = trainer.max_steps if trainer.max_steps > 0 else math.inf
        if trainer.max_epochs is not None and trainer.max_epochs >= 0:  # an epoch limit too
            steps = min(steps, trainer.max_epochs * steps_per_epoch(trainer))
        if duration is None or step == 0:
            return steps
        # Rank 0's clock, as Lightning's Timer decides when to stop: every replica of a
        # distributed run must take the same learning rate.
        elapsed = trainer.strategy.broadcast(timer.time_elapsed())
        return steps if elapsed <= 0 else min(steps, step * duration / elapsed)

    return horizon


# Each schedule: (optimizer, the optim options, the Trainer) -> Lightning's scheduler config,
# or None for a constant learning rate.
Scheduler = Callable[[torch.optim.Optimizer, OptimConfig, "L.Trainer"], "dict | None"]


def _per_step(optimizer: torch.optim.Optimizer, factor: Callable[[int], float]) -> dict:
    """A factor of the peak lr, updated after every optimizer step."""
    return {"scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, factor), "interval": "step"}


def _inverse_sqrt(optimizer: torch.optim.Optimizer, optim: OptimConfig, trainer: L.Trainer) -> dict:
    return _per_step(optimizer, inverse_sqrt(optim.warmup_steps))


def _cosine(optimizer: torch.optim.Optimizer, optim: OptimConfig, trainer: L.Trainer) -> dict:
    return _per_step(optimizer, warmup_cosine(optim.warmup_steps, budget_horizon(trainer),
                                              optim.min_lr / optim.lr))


def _plateau(optimizer: torch.optim.Optimizer, optim: OptimConfig, trainer: L.Trainer) -> dict:
    """x ``plateau_factor`` at the first validation after ``plateau_patience`` validations
    without a better BLEU (ReduceLROnPlateau's patience). Stepped by the module after every
    validation (``TranslationModule.step_plateau``): Lightning would step it at epoch ends
    alone, on the last validation's BLEU, and fail at an epoch that had none."""
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
        optimizer, mode="max", factor=optim.plateau_factor, patience=optim.plateau_patience,
        min_lr=optim.min_lr)
    return {"scheduler": scheduler, "monitor": "val_bleu", "strict": False}


def _constant(optimizer: torch.optim.Optimizer, optim: OptimConfig, trainer: L.Trainer) -> None:
    return None


SCHEDULERS: dict[str, Scheduler] = {"inverse_sqrt": _inverse_sqrt, "cosine": _cosine,
                                    "plateau": _plateau, "constant": _constant}
SCHEDULES = tuple(SCHEDULERS)
