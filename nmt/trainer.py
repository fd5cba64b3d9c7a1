"""The Lightning Trainer as a training run uses it: checkpoints (best, last, the last N kept),
early stopping, the options' callbacks, atomic checkpoint writes, the chosen precision, and
silence for what Lightning prints that nobody can act on. ``benchmark_trainer`` sets up the
same training steps without validation, checkpoints or logs, for the benchmarks."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.strategies.launchers import _MultiProcessingLauncher
from lightning.pytorch.utilities import GradClipAlgorithmType, rank_zero_only

from nmt.callbacks import (
    DropoutForBudget,
    KeepLastCheckpoints,
    PatientEarlyStopping,
    ResumingProgressBar,
    RunCheckpoint,
    StopAtBudget,
    StopOnSignals,
    WarmupWithinBudget,
    WeightEMA,
)
from nmt.config import Config
from nmt.config_checks import BEST_METRICS, max_time
from nmt.errors import NMTError
from nmt.files import save_atomic
from nmt.precision import (
    AUTOCAST_DTYPES,
    PrecisionChoice,
    choose_cpu_precision,
    lightning_name,
    probe_shapes,
    resolve_precision,
)

_announced: set[PrecisionChoice] = set()  # the choices this process has printed


def training_precision(config: Config, kept: PrecisionChoice | None = None) -> PrecisionChoice:
    """``resolve_precision`` for a run's ``Config`` (its model's shapes), printed once per
    process so that the user sees what ``auto`` chose and why. ``kept``: the precision a
    resumed run has trained in (``nmt.resume.kept_precision``), which ``auto`` keeps."""
    shapes = probe_shapes(config.model, config.data.vocab_size)
    rank_zero = rank_zero_only.rank == 0  # DDP's other processes stay quiet
    if kept is not None and config.trainer.precision == "auto":
        choice = kept
    else:
        choice = resolve_precision(config.trainer.precision,
                                   lambda: choose_cpu_precision(shapes, leader=rank_zero),
                                   config.trainer.accelerator)
    if kept is not None and lightning_name(choice.precision) != kept.precision:
        choice = replace(choice, reason=f"{choice.reason}; the run trained in {kept.precision} "
                                        "so far")
    if choice not in _announced and rank_zero:  # once per process
        _announced.add(choice)
        print(f"precision: {choice.precision} ({choice.reason})", flush=True)
    return choice


class CachedMixedPrecision(MixedPrecision):
    """Lightning's mixed precision with autocast's cast cache on.

    Lightning 2.6 runs steps under ``torch.autocast(..., cache_enabled=False)``, which casts a
    weight to bf16 again at every use. The RNN decoder uses each weight at every target
    position, so each decoder weight is cast ~20 times per step: the RNN's step ran 1.07x
    faster on average with the cache (1.01-1.13x; Lightning issue 21611). Lightning turned the
    cache off because a ``no_grad`` forward inside autocast used to poison it (torch issue
    112583); torch fixed that itself (pull 165068; tested here), our steps run no such forward,
    and the cache is cleared when each step's context exits, before the optimizer changes the
    weights. With the cache a reused weight's gradient sums in bf16 before its one cast back,
    as under plain ``torch.autocast`` (cache on by default): 0.3% from the fp32 sum on the
    tiny RNN."""

    def forward_context(self) -> torch.autocast:
        return torch.autocast(self.device, dtype=AUTOCAST_DTYPES[self.precision.split("-")[0]])

    def clip_gradients(self, optimizer: torch.optim.Optimizer, clip_val: float = 0.0,
                       gradient_clip_algorithm: GradClipAlgorithmType = GradClipAlgorithmType.NORM,
                       ) -> None:
        """Lightning refuses to clip for an optimizer that unscales its own gradients (fused
        Adam), which is right under fp16's gradient scaler: they would be clipped still scaled.
        bf16 has no scaler, so its gradients are the true ones and clip as in full precision."""
        if self.scaler is None:
            Precision.clip_gradients(self, optimizer, clip_val, gradient_clip_algorithm)
        else:
            super().clip_gradients(optimizer, clip_val, gradient_clip_algorithm)


def trainer_precision(choice: PrecisionChoice, accelerator: str) -> tuple[str | None, list]:
    """``L.Trainer``'s ``precision`` flag and precision plugins for ``choice``: a mixed
    precision (bf16-mixed, 16-mixed, or Lightning's short names for them, bf16 and 16) as
    ``CachedMixedPrecision``, any other by its name."""
    precision = lightning_name(choice.precision)
    if not precision.endswith("-mixed"):
        return precision, []
    cuda = torch.cuda.is_available() and accelerator in ("auto", "cuda", "gpu")
    return None, [CachedMixedPrecision(precision, "cuda" if cuda else "cpu")]


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write to a temporary file and rename: a killed run never leaves a truncated checkpoint."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        save_atomic(checkpoint, path)


class _DropTip(logging.Filter):
    """Drops Lightning's tip to install its cloud logger, printed at every Trainer."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("💡 Tip")


_DROP_TIP = _DropTip()


def quiet_lightning_noise() -> None:
    """Silence, for the rest of the process, what Lightning prints to every user that none of
    them can act on, all false alarms here:

    - its advice to start DataLoader workers wherever the host has more than 2 cores. A batch
      here is cut from token ids prepared once, in 0.07 ms (AMD EPYC Zen 4) against 19 ms for a
      training step on an H200 (``data.num_workers`` still starts workers where a pipeline
      needs them);
    - "Checkpoint directory ... exists and is not empty": the run directory holds the config
      and the SentencePiece model before training starts, and a resumed run its checkpoints
      (``nmt.resume.check_resumable`` refuses to train a new run over checkpoints it cannot resume);
    - under DDP, its advice to log our epoch metrics with ``sync_dist=True``: the validation
      scores are summed over the processes before they are logged, the tokens/s counts every
      process's tokens, and the wall-clock minutes are the same on each;
    - that the plateau schedule's val_bleu is missing at the end of an epoch that had no
      validation: the module steps that schedule at validations, not Lightning at epoch ends
      (``TranslationModule.step_plateau``);
    - that an epoch has fewer batches than ``log_every_n_steps`` (a small corpus), "Set a
      lower value ... if you want to see logs for the training epoch": Lightning counts the
      batches to the next log across epoch ends, so the training loss is logged every N
      updates all the same. Raised at every epoch's start, it was printed twice, again where
      something between the epochs changed the warning filters (a subprocess started does);
    - the FutureWarning torch 2.13 raises at Lightning 2.6's own use of ``LeafSpec``;
    - its tip to install a cloud logger;
    - resuming with fewer callbacks than the checkpoint holds ("Be aware that when using
      `ckpt_path`, callbacks used to create the checkpoint need to be provided"): early stopping
      and checkpoint keeping may be turned off between segments (``RESUMABLE_CHANGES``).

    Warnings are filtered as Lightning's docs show, the tip on Lightning's rank-zero logger
    (adding the same filter twice keeps one)."""
    for message in (".*Consider increasing the value of the `num_workers` argument",
                    "Checkpoint directory .* exists and is not empty",
                    r"It is recommended to use `self\.log\('(val_loss|val_bleu|wall_minutes|"
                    r"train_tgt_tok_per_s)'.*sync_dist=True",
                    "ReduceLROnPlateau conditioned on metric val_bleu which is not available",
                    r"The number of training batches \(\d+\) is smaller than the logging interval",
                    "Be aware that when using `ckpt_path`, callbacks used to create the checkpoint"):
        warnings.filterwarnings("ignore", message)
    warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                            category=FutureWarning)
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_DROP_TIP)


def training_callbacks(config: Config, run_dir: Path) -> list[L.Callback]:
    """best.ckpt, last.ckpt, the end of the budget, and the options' callbacks (the progress
    bar, early stopping, weight EMA, the last N checkpoints kept, dropout by the budget's
    epochs)."""
    t = config.trainer
    # Checkpoints and early stopping act after each validation (once per epoch, or every
    # trainer.val_check_interval batches, and at the budget's end): patience counts validations.
    metric = t.best_metric
    callbacks: list[L.Callback] = [
        RunCheckpoint(
            dirpath=run_dir, filename="best", monitor=metric, mode=BEST_METRICS[metric],
            save_top_k=1, enable_version_counter=False, save_on_train_epoch_end=False,
        ),
        # Lightning's save_last only writes when "best" does; this one writes every validation.
        RunCheckpoint(dirpath=run_dir, filename="last", enable_version_counter=False,
                      save_on_train_epoch_end=False),
        StopAtBudget(),
        StopOnSignals(),
    ]
    if t.enable_progress_bar:
        callbacks.append(ResumingProgressBar())
    if t.max_time is None:
        # The clock of a segment without --max-time: Lightning's own Timer (one comes with a
        # budget) keeps the run's training time in every checkpoint, so a later --max-time
        # counts this segment too instead of restarting from zero.
        callbacks.append(Timer(duration=None))
    if t.early_stopping_patience > 0:
        callbacks.append(PatientEarlyStopping(monitor=metric, mode=BEST_METRICS[metric],
                                              patience=t.early_stopping_patience,
                                              check_on_train_epoch_end=False))
    if config.optim.ema_decay > 0:
        callbacks.append(WeightEMA(config.optim.ema_decay))
    # Also at 0: it deletes the checkpoints an earlier segment kept (keep_last_checkpoints
    # lowered on resume), which nmt average would otherwise take for the run's last ones.
    callbacks.append(KeepLastCheckpoints(run_dir, t.keep_last_checkpoints))
    optim = config.optim
    if optim.long_run_dropout is not None or optim.short_run_dropout is not None:
        callbacks.append(DropoutForBudget(optim.long_run_dropout, optim.long_run_epochs,
                                          optim.short_run_dropout, optim.short_run_epochs))
    if config.optim.schedule == "cosine":
        callbacks.append(WarmupWithinBudget(config.optim.warmup_steps))
    return callbacks


@contextmanager
def lightnings_option_errors() -> Iterator[None]:
    """Lightning's errors for options it rejects (strategy, devices, accelerator, precision) as
    one-line ``NMTError``s: around the Trainer's construction alone, where a TypeError is
    Lightning's (it raises one for devices=-2 or abc), not a bug of ours."""
    try:
        yield
    except (ValueError, TypeError, ImportError, MisconfigurationException) as err:
        raise NMTError(f"trainer option rejected by Lightning: {str(err).splitlines()[0]}") from None


@contextmanager
def lightnings_info_silenced() -> Iterator[None]:
    """Lightning's info lines (its report of the devices) left unprinted while the block runs."""
    log = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(level)


def check_device_options(config: Config) -> int:
    """Lightning's checks of trainer.accelerator, devices, num_nodes and strategy, and
    ``check_launcher``'s, on a Trainer of these options alone (milliseconds): before the run's
    lock and the precision probe, whose wait and line came first where the Trainer of the run
    refused one. Its report of the devices is silenced; the run's Trainer gives it. Returns
    the processes Lightning trains the run in (``world_size``)."""
    t = config.trainer
    with lightnings_option_errors(), lightnings_info_silenced():
        trainer = L.Trainer(accelerator=t.accelerator, devices=t.devices, num_nodes=t.num_nodes,
                            strategy=t.strategy, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False)
    check_launcher(trainer, t.strategy)
    check_nodes_can_meet(trainer)
    return trainer.world_size


def check_nodes_can_meet(trainer: L.Trainer) -> None:
    """Across machines started by hand (no torchrun, SLURM or MPI: Lightning's own
    environment), node 0 listens at MASTER_ADDR:MASTER_PORT, which Lightning otherwise takes as
    127.0.0.1 and a random free port: the other nodes could never find it, and every process
    would wait for them in silence until torch's timeout (30 minutes)."""
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if trainer.num_nodes > 1 and isinstance(trainer.strategy.cluster_environment,
                                            LightningEnvironment) and missing:
        raise NMTError(f"trainer.num_nodes {trainer.num_nodes}: set {' and '.join(missing)} (node 0's "
                       f"address and a free port) and NODE_RANK (0 to {trainer.num_nodes - 1}) on "
                       "every node, then start the same command on each")


def check_launcher(trainer: L.Trainer, strategy: str) -> None:
    """Only strategies that run this same command in every process: those that start
    processes for fit alone (ddp_spawn, ddp_fork, and ``auto`` on several GPUs in a notebook)
    hand nothing back to the process that finishes the run (its last validation,
    train_stats.json)."""
    if isinstance(trainer.strategy.launcher, _MultiProcessingLauncher):
        raise NMTError(f"trainer.strategy {strategy} trains in processes that "
                       "hand nothing back to the one that finishes the run: use ddp, which runs "
                       "the same command in one process per device")


def training_loggers(run_dir: Path, tensorboard: bool) -> list[Logger]:
    """CSV logs in RUN/logs/version_N/metrics.csv (a resumed run adds a version), and with
    ``tensorboard`` the same metrics as TensorBoard events in RUN/tensorboard/version_N/."""
    loggers: list[Logger] = [CSVLogger(run_dir, name="logs")]
    if tensorboard:
        try:
            loggers.append(TensorBoardLogger(run_dir, name="tensorboard", default_hp_metric=False))
        except ModuleNotFoundError:  # Lightning's message names an extra of its own
            raise NMTError('trainer.tensorboard needs TensorBoard: pip install -e ".[tensorboard]"'
                           ) from None
    return loggers


def build_trainer(config: Config, run_dir: Path, kept: PrecisionChoice | None = None) -> L.Trainer:
    """The Trainer of a training run writing into ``run_dir``, in the precision chosen for it
    (``training_precision``; ``kept``: a resumed run's) once its device options have passed
    Lightning's checks and ours (``check_device_options``, which ``train`` calls before the
    run's lock)."""
    t = config.trainer
    quiet_lightning_noise()
    precision, precision_plugins = trainer_precision(training_precision(config, kept), t.accelerator)
    once_per_epoch = isinstance(t.val_check_interval, float) and t.val_check_interval == 1.0
    callbacks = training_callbacks(config, run_dir)
    loggers = training_loggers(run_dir, t.tensorboard)
    budget = max_time(t.max_time)
    with lightnings_option_errors():
        return L.Trainer(
            default_root_dir=run_dir,
            max_epochs=t.max_epochs,
            max_steps=t.max_steps,
            max_time=budget,
            accelerator=t.accelerator,
            devices=t.devices,
            num_nodes=t.num_nodes,
            strategy=t.strategy,
            precision=precision,
            gradient_clip_val=t.gradient_clip_val,
            accumulate_grad_batches=t.accumulate_grad_batches,
            # once per epoch as Lightning's default (None): given as 1.0, Lightning announces it
            val_check_interval=None if once_per_epoch else t.val_check_interval,
            # An integer interval counts batches across epoch ends, not within each epoch.
            check_val_every_n_epoch=None if isinstance(t.val_check_interval, int) else 1,
            log_every_n_steps=t.log_every_n_steps,
            enable_progress_bar=t.enable_progress_bar,
            # In its place, nmt.training.print_model_size's line: Lightning's table had one row
            # (the model) and a FLOPs column and total of 0 (it counts them only over an
            # example_input_array, which would cost a forward at every start)
            enable_model_summary=False,
            use_distributed_sampler=False,  # our batch sampler shards batches across ranks itself
            logger=loggers,
            # A fresh sampler each epoch, seeded by the epoch (Lightning's set_epoch does not reach
            # a batch sampler), so resumed and uninterrupted runs see the same batches.
            reload_dataloaders_every_n_epochs=1,
            callbacks=callbacks,
            plugins=[AtomicCheckpointIO(), *precision_plugins],
            num_sanity_val_steps=0,
        )


def benchmark_trainer(config: Config, max_steps: int, callbacks: list[L.Callback],
                      precision: PrecisionChoice | None = None) -> L.Trainer:
    """A Trainer for ``max_steps`` training steps on one device as ``nmt train`` runs them
    (precision, gradient clipping and accumulation), without validation, checkpoints, logs
    or progress bar: what the benchmarks time. ``precision``: training's choice (``training_precision``),
    where the caller has it already."""
    precision = precision or training_precision(config)
    flag, plugins = trainer_precision(precision, config.trainer.accelerator)
    quiet_lightning_noise()
    with lightnings_option_errors():
        return L.Trainer(
            max_steps=max_steps, limit_val_batches=0, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
            accelerator=config.trainer.accelerator, devices=1, precision=flag, plugins=plugins,
            gradient_clip_val=config.trainer.gradient_clip_val,
            accumulate_grad_batches=config.trainer.accumulate_grad_batches,
        )
