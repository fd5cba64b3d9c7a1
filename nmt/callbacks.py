"""Lightning callbacks of a training run: an EMA of the weights, the end of a budget,
checkpoints and early stopping that resume as the run was (moved, or with a new patience), the
last N checkpoints kept for ``nmt average``, dropout chosen by the epochs the budget buys, the
signals that stop a run, and a progress bar that knows a resumed epoch."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, TQDMProgressBar, WeightAveraging
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason
from lightning.pytorch.utilities.exceptions import SIGTERMException

from nmt.average import STEPS_DIR, step_checkpoints, step_of
from nmt.files import remove_empty
from nmt.schedules import budget_horizon, steps_per_epoch


def ramped_ema(decay: float):
    """``AveragedModel`` update: EMA whose decay after n updates is min(decay, (1+n)/(10+n))."""

    def update(averaged: torch.Tensor, current: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        d = ((1 + n) / (10 + n)).clamp(max=decay)
        return averaged + (current - averaged) * (1 - d)

    return update


class WeightEMA(WeightAveraging):
    """Exponential moving average of the weights (Polyak averaging), validated and saved in
    place of the raw weights; it smooths out the noise of large learning rates.

    The decay ramps up as (1 + n) / (10 + n) after n updates, capped at ``decay``, so the
    average soon forgets the random initialisation and spans about the last tenth of the
    steps so far: the same rule suits a 15-minute and a 15-hour run.
    """

    def __init__(self, decay: float):
        super().__init__(avg_fn=ramped_ema(decay))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Keep the raw weights in the module (Lightning would copy the average in), so that
        the last.ckpt written after training resumes exactly; every checkpoint holds the
        average as its ``state_dict`` and the raw weights as ``current_model_state``."""


class StopAtBudget(L.Callback):
    """Ends a step budget, and the last epoch of an epoch budget, the way Lightning ends a time
    budget, by ``should_stop``: the last stretch is then validated inside the loop, where every
    callback acts on it as on any validation (best.ckpt and its record, the kept checkpoints,
    early stopping), whatever trainer.val_check_interval. A step budget's checkpoint then also
    resumes in the middle of the epoch (one written after ``fit`` would mark it finished)."""

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        steps_done = 0 < trainer.max_steps <= trainer.global_step
        last_epoch_done = 0 < trainer.max_epochs <= trainer.current_epoch + 1 \
            and trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        if steps_done or last_epoch_done:
            trainer.should_stop = True


def raise_sigterm(signum, frame) -> None:
    """A signal handler: ``SIGTERMException`` where the process is, as Ctrl-C raises
    ``KeyboardInterrupt``."""
    raise SIGTERMException


class StopOnSignals(L.Callback):
    """SIGTERM (a scheduler's stop) and SIGHUP (the run's terminal closed) stop training, and
    the run resumes from the last.ckpt of its last validation (written atomically; Lightning
    saves none at a signal either). Set once Lightning's own handlers are (before
    ``on_train_start``); its teardown restores every signal's handler as it was.

    * Under DDP, SIGTERM ends each process that gets it at once, as Ctrl-C does, instead of
      Lightning's handler, which broadcasts from inside the handler to stop every process at
      the next batch: that broadcast pairs with whatever collective the other processes are
      in, and a SIGTERM to the whole process group (scancel, systemd) hung the run (Lightning
      issue 20806). ``nmt.training.fit`` stops the processes that got no signal.
    * SIGHUP does what SIGTERM does; its default killed the process silently (exit 129). A
      SIGHUP the process ignores (``nohup``) stays ignored."""

    def __init__(self):
        self.stopped_by = "SIGTERM"  # the signal's name, for the line that says so

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # Python sets handlers in the main thread alone (Lightning sets none there)
        if trainer.world_size > 1:
            signal.signal(signal.SIGTERM, raise_sigterm)
        sigterm = signal.getsignal(signal.SIGTERM)
        if not callable(sigterm) or signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
            return

        def hang_up(signum: int, frame) -> None:
            self.stopped_by = "SIGHUP"
            sigterm(signum, frame)

        signal.signal(signal.SIGHUP, hang_up)


class RunCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint for a run's own folder, whose record survives the run being
    moved: Lightning drops the record of kept files and best score where the folder's path
    changed, so a moved run, resumed, replaced best.ckpt at its first validation whatever the
    score. Here the record's paths are moved with the folder. Checkpoints hold it under
    Lightning's own key, as before."""

    @property
    def state_key(self) -> str:
        return super().state_key.replace(type(self).__qualname__, "ModelCheckpoint", 1)

    def load_state_dict(self, state_dict: dict) -> None:
        before = state_dict.get("dirpath")
        if before and self.dirpath and before != self.dirpath:
            state_dict = moved_paths(state_dict, before, self.dirpath)
        super().load_state_dict(state_dict)


class KeepLastCheckpoints(RunCheckpoint):
    """Keeps the newest ``n`` validation checkpoints as RUN/steps/step<global step>.ckpt (ranked
    by step: the oldest is deleted first), saved at validations as last.ckpt is; ``n`` 0
    keeps none.

    A resumed run takes its record of kept files from the folder, not from the checkpoint:
    last.ckpt is written before this callback saves at the same validation, so its record
    misses the newest file, which was then never deleted. Files past the newest ``n`` are
    deleted then, also where ``n`` was lowered on resume, to 0 too (and the emptied folder):
    an earlier segment's files left there were averaged by a later ``nmt average`` as if
    they were the run's last checkpoints.
    """

    def __init__(self, run_dir: str | Path, n: int):
        super().__init__(dirpath=Path(run_dir) / STEPS_DIR, filename="step{step}",
                         monitor="step", mode="max", save_top_k=n,
                         auto_insert_metric_name=False, enable_version_counter=False,
                         save_on_train_epoch_end=False)

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        files = step_checkpoints(Path(self.dirpath).parent)
        kept = files[-self.save_top_k:] if self.save_top_k else []  # [-0:] is all of them
        deleted = files[: len(files) - len(kept)]
        for path in deleted:
            trainer.strategy.remove_checkpoint(path)  # on rank 0
        if deleted and trainer.is_global_zero:  # said: the user's files, which nmt average took
            print(f"trainer.keep_last_checkpoints {self.save_top_k}: deleted "
                  f"{', '.join(path.name for path in deleted)} (kept in {self.dirpath} by an "
                  "earlier segment)")
        if files and not kept and trainer.is_global_zero:
            remove_empty([Path(self.dirpath)])
        self.best_k_models = {str(path): torch.tensor(step_of(path)) for path in kept}
        if kept:
            self.best_model_path, self.best_model_score = str(kept[-1]), self.best_k_models[str(kept[-1])]
        if kept and len(kept) == self.save_top_k:
            self.kth_best_model_path, self.kth_value = str(kept[0]), self.best_k_models[str(kept[0])]


def moved_paths(value, before: str, now: str):
    """``value`` (a string, or dicts of them, keys too) with each path under folder ``before``
    under folder ``now`` instead."""
    if isinstance(value, dict):
        return {moved_paths(key, before, now): moved_paths(item, before, now)
                for key, item in value.items()}
    if isinstance(value, str) and (value == before or value.startswith(before + os.sep)):
        return now + value[len(before):]
    return value


def validation_on_cadence(trainer: L.Trainer) -> bool:
    """Whether the running validation of training is one of trainer.val_check_interval's (an
    epoch's end, every N batches), by Lightning's own test with the budget's stop request left
    out, not one that a step or time budget ending between them added (``StopAtBudget``,
    Lightning's Timer). What decides the trajectory (the plateau schedule's rate, early
    stopping's count) weighs the cadence's alone: a run stopped by a budget and resumed then
    goes on as the uninterrupted run, which has no validation there; at a run's true end
    they change nothing. Rank 0's answer, on every process: a time interval reads each one's
    own clock, and early stopping's decision is a collective that all or none must join."""
    stopping, trainer.should_stop = trainer.should_stop, False
    try:
        on_cadence = trainer.fit_loop.epoch_loop._should_check_val_fx(trainer.fit_loop._data_fetcher)
    finally:
        trainer.should_stop = stopping
    return trainer.strategy.broadcast(on_cadence)


class PatientEarlyStopping(EarlyStopping):
    """Lightning's early stopping with the patience given now: a checkpoint restores the
    validations waited, not the patience, which a resumed run may change (raised, to train
    on after an early stop). Under the new patience a run not yet out of it is not stopped."""

    @property
    def state_key(self) -> str:
        """Lightning's own early stopping's, under which earlier runs' checkpoints hold it."""
        return super().state_key.replace(type(self).__qualname__, "EarlyStopping", 1)

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        """Turned on in a resumed run whose checkpoint holds no early stopping (its patience
        was 0): the best score so far is the run's best checkpoint's, not none, under which
        the first validation after the resume counted as an improvement whatever it scored.
        The validations since that best are not counted (no checkpoint kept them): the run
        gets its whole patience from the resume."""
        states = checkpoint.get("callbacks", {})
        if any(key.startswith("EarlyStopping") for key in states):
            return  # its own state follows (load_state_dict)
        best = next((state.get("best_model_score") for key, state in states.items()
                     if key.startswith("ModelCheckpoint") and isinstance(state, dict)
                     and state.get("monitor") == self.monitor), None)
        if best is not None:
            self.best_score = torch.as_tensor(float(best))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Counts the validations of the cadence (``validation_on_cadence``): one a budget
        added counted too, and a run stopped by the budget there and resumed stopped a
        validation or more before the uninterrupted run, or trained nothing."""
        if validation_on_cadence(trainer):
            super().on_validation_end(trainer, pl_module)

    def load_state_dict(self, state_dict: dict) -> None:
        patience = self.patience
        super().load_state_dict(state_dict)
        self.patience = patience
        # The reason restored is an earlier segment's: this one has not stopped (train() does
        # not resume a run out of its patience, ``nmt.resume.out_of_patience``).
        self.stopping_reason, self.stopping_reason_message = EarlyStoppingReason.NOT_STOPPED, None


class DropoutForBudget(L.Callback):
    """Residual dropout chosen by the number of epochs the budget buys.

    How much dropout pays depends on how long the model trains: the default Transformer on
    Multi30k was still underfitting at 3.3 epochs, where no dropout after the first epoch beat
    0.1, and at 4-10, where 0.1 beat 0.2, and overfit with 0.1 by 14-16, where 0.2 won by 1.7
    BLEU (docs/performance.md). A time budget buys more epochs on a faster machine, so no one
    value suits every machine. This callback
    trains the first epoch with the model's dropout, then reads the budget's end
    (``budget_horizon``: max_steps, max_epochs, or max_time at the speed of that epoch) and
    sets ``long_dropout`` for the rest of the run if that lies at least ``long_epochs``
    epochs out, ``short_dropout`` if under ``short_epochs`` (either None: not chosen), else
    keeps the model's (``set_dropout`` of the model). The decision is made once, printed, and
    kept in checkpoints, so a resumed run keeps it.
    """

    def __init__(self, long_dropout: float | None, long_epochs: float,
                 short_dropout: float | None = None, short_epochs: float = 3.5):
        self.long_dropout, self.long_epochs = long_dropout, long_epochs
        self.short_dropout, self.short_epochs = short_dropout, short_epochs
        self.decided, self.chosen = False, None  # chosen: the dropout set, None while kept

    def state_dict(self) -> dict:
        return {"decided": self.decided, "chosen": self.chosen}

    def load_state_dict(self, state_dict: dict) -> None:
        self.decided = state_dict["decided"]
        if "chosen" in state_dict:
            self.chosen = state_dict["chosen"]
        else:  # a checkpoint from before the short-run rule: long or kept
            self.chosen = self.long_dropout if state_dict["switched"] else None

    def budget_epochs(self, trainer: L.Trainer) -> float:
        """The epochs the budget buys, as known now."""
        return budget_horizon(trainer)(trainer.global_step) / steps_per_epoch(trainer)

    def choose(self, epochs: float) -> float | None:
        """The dropout for a budget of ``epochs``; None: the model's kept."""
        if self.long_dropout is not None and epochs >= self.long_epochs:
            return self.long_dropout
        if self.short_dropout is not None and epochs < self.short_epochs:
            return self.short_dropout
        return None

    def rule(self) -> str:
        """The rule as printed: "short run: under 4, long run: 12 or more"."""
        runs = []
        if self.short_dropout is not None:
            runs.append(f"short run: under {self.short_epochs:g}")
        if self.long_dropout is not None:
            runs.append(f"long run: {self.long_epochs:g} or more")
        return ", ".join(runs)

    def on_train_epoch_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if not self.decided and trainer.current_epoch >= 1:
            self.decided = True
            epochs = self.budget_epochs(trainer)
            self.chosen = self.choose(epochs)
            if trainer.is_global_zero:
                choice = ("the model's dropout kept" if self.chosen is None
                          else f"dropout {self.chosen} from now on")
                print(f"\nthe budget buys {epochs:.1f} epochs ({self.rule()}): {choice}", flush=True)
        if self.chosen is not None:
            module.model.set_dropout(self.chosen)

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        # A run resumed inside an epoch starts no epoch, so the decision restored from its
        # checkpoint is applied here (before its first batch) as well.
        if self.chosen is not None:
            module.model.set_dropout(self.chosen)


class WarmupWithinBudget(L.Callback):
    """A note, once, where the budget ends inside the cosine schedule's warm-up: the last
    update then trains at budget / warm-up of the peak rate, and the rate never anneals
    (``warmup_cosine``), which no option says. Read at the start (``max_steps``,
    ``max_epochs``) and, for a time budget, at the first epoch's speed, as
    ``DropoutForBudget`` reads it. A note, not an error: a short smoke run is fine so."""

    def __init__(self, warmup: int):
        self.warmup = warmup
        self.noted = False

    def _check(self, trainer: L.Trainer) -> None:
        # not before the update reached: a time budget spent before the first epoch ended
        # (the Timer stopped it) extrapolates below it
        end = max(budget_horizon(trainer)(trainer.global_step), trainer.global_step)
        if self.noted or not trainer.is_global_zero or end > self.warmup:
            return
        self.noted = True
        print(f"\nnote: the budget ends at update {end:.0f}, inside optim.warmup_steps "
              f"{self.warmup}: the learning rate rises to {end / self.warmup:.0%} of its peak "
              "and never anneals; give a shorter warm-up for a budget this short", flush=True)

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self._check(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if trainer.current_epoch == 0:  # a time budget's end, at the first epoch's speed
            self._check(trainer)


class ResumingProgressBar(TQDMProgressBar):
    """Lightning's progress bar, also for an epoch resumed in its middle. Lightning starts no
    epoch there (no ``on_train_epoch_start``), so its bar was never set up for one: a run
    resumed at batch 780 of 12,095 showed ``Training: 781/?`` with no total or time left until
    the epoch ended (an hour and more on a large corpus), and a rate that counted the skipped
    batches as trained in its first second (1,089 it/s, then falling slowly towards the real
    2.4). Here the resumed epoch's bar is set up as a started one's, its count starting at the
    batches already trained (tqdm's ``initial``: the rate counts only the batches after it)."""

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        super().on_train_start(trainer, module)
        if trainer.fit_loop.restarted_mid_epoch:
            self.on_train_epoch_start(trainer, module)
            bar = self.train_progress_bar
            bar.initial = bar.n = trainer.fit_loop.epoch_loop.batch_progress.current.completed
            bar.refresh()

    def on_train_epoch_start(self, trainer: L.Trainer, *args) -> None:
        # The next epoch's bar counts from 0: its reset below 'initial' showed a negative rate.
        self.train_progress_bar.initial = 0
        super().on_train_epoch_start(trainer, *args)
