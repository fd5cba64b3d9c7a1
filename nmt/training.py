"""Training with Lightning: a thin LightningModule around any ``Seq2Seq`` model, and
``train(config)``, a plain function that prepares data, builds the model and runs the Trainer.

The run directory holds everything needed later: best.ckpt, last.ckpt, config.yaml,
spm.model and logs/metrics.csv. Re-running the same command resumes from last.ckpt.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import resource
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import lightning as L
import torch
import yaml
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, Timer, WeightAveraging
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins.io import TorchCheckpointIO

from nmt.average import final_weights, keep_last_callback
from nmt.config import Config, DecodingConfig, OptimConfig, run_dir_of, save_config, to_dict
from nmt.data.batching import Batch
from nmt.data.module import TranslationDataModule, prepare_data
from nmt.data.tokenizer import PAD, Tokenizer
from nmt.errors import NMTError
from nmt.files import write_atomic
from nmt.loss import smoothed_cross_entropy
from nmt.metrics import bleu_from_statistics, bleu_statistics
from nmt.models import build_model, check_model_config
from nmt.precision import trainer_precision, training_precision
from nmt.provenance import code_commit, device_name
from nmt.search import greedy_search


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def inverse_sqrt(warmup: int):
    """Vaswani et al. (2017) eq. (3), relative to the peak lr: linear warm-up, then 1/sqrt(step)."""
    return lambda step: min((step + 1) / warmup, (warmup / (step + 1)) ** 0.5)


def warmup_cosine(warmup: int, horizon: Callable[[int], float], floor: float):
    """Linear warm-up, then half a cosine from the peak lr down to ``floor`` x peak at the
    budget's last step, ``horizon(step)`` (Loshchilov & Hutter 2017, one cycle): for a fixed
    budget, where annealing to its end pays more than a schedule that never ends."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1.0, horizon(step) - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def steps_per_epoch(trainer: L.Trainer) -> float:
    """Optimizer steps in one epoch of the running fit."""
    return trainer.num_training_batches / trainer.accumulate_grad_batches


def budget_horizon(trainer: L.Trainer) -> Callable[[int], float]:
    """The step at which training will end, as known at ``step``: ``max_steps`` or the steps of
    ``max_epochs`` epochs, whichever comes first (as Lightning stops), or, sooner, the step that
    ``max_time`` reaches at the speed so far (``step`` x duration / time elapsed, validation
    included; the Timer's elapsed time survives a resume). A time budget thus anneals to its
    end, whatever the machine's speed.

    Read when the schedule steps, from the loop's own counts: ``estimated_stepping_batches``
    would build a training loader here, and drawing its seeds would shift the dropout masks of
    a resumed run against an uninterrupted one."""
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


SCHEDULES = ("inverse_sqrt", "cosine", "plateau", "constant")
# trainer.best_metric -> its better direction. val_loss is the cross-entropy of the references
# (no label smoothing), as fairseq and Marian select by default; val_bleu is greedy BLEU,
# noisier from one validation to the next.
BEST_METRICS = {"val_loss": "min", "val_bleu": "max"}


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


class TranslationModule(L.LightningModule):
    """Label-smoothed cross-entropy training; validation loss and greedy-decoding BLEU."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Tokenizer,
        optim: OptimConfig,
        decoding: DecodingConfig,
        val_references: list[str],
        seed: int,
    ):
        super().__init__()
        self.model, self.tokenizer = model, tokenizer
        self.optim, self.decoding = optim, decoding
        self.val_references, self.seed = val_references, seed
        # Running totals over the whole run, resumed segments included (kept in checkpoints).
        self.totals = {"tgt_tokens": 0, "step_seconds": 0.0, "wall_seconds": 0.0}
        # One entry per training segment (a resume starts a new one): the code and device it
        # ran on, so that results name everything that produced their weights.
        self.segments: list[dict] = []
        self._fit_start = time.perf_counter()
        self.validated_step = -1  # global step of the latest validation
        self._epoch_tokens, self._epoch_seconds = 0, 0.0

    def _loss(self, batch: Batch, label_smoothing: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean token loss over non-pad targets, and the number of such tokens."""
        logits = self.model(batch.src, batch.src_mask, batch.tgt_in)  # (B, T, V)
        target = batch.tgt_out.flatten()
        # fp32 softmax under bf16, a block of rows at a time (nmt/loss.py: 1.1-1.2x per step)
        loss = smoothed_cross_entropy(logits.flatten(0, 1), target, label_smoothing, PAD)
        return loss, (target != PAD).sum()

    def on_fit_start(self) -> None:
        self._fit_start = time.perf_counter()

    def on_train_start(self) -> None:
        # Here, not in on_fit_start: the resumed global step and segments are restored by now.
        self.segments.append({
            "from_step": self.global_step, "code": code_commit(), "device": device_name(),
            "precision": str(self.trainer.precision),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")})

    def on_train_epoch_start(self) -> None:
        self._epoch_tokens, self._epoch_seconds = 0, 0.0

    def on_train_batch_start(self, batch: Batch, batch_idx: int) -> None:
        # Dropout draws depend only on (seed, epoch, batch, rank), so a resumed run continues
        # exactly like an uninterrupted one, whatever else drew random numbers meanwhile.
        torch.manual_seed(hash((self.seed, self.current_epoch, batch_idx, self.global_rank)))
        self._step_start = time.perf_counter()

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        loss, tokens = self._loss(batch, self.optim.label_smoothing)
        self._epoch_tokens += tokens.detach()  # a tensor: no device sync per step
        self.log("train_loss", loss, prog_bar=True, batch_size=batch.src.size(0))
        self.log("lr", self.optimizers().param_groups[0]["lr"], batch_size=batch.src.size(0))
        return loss

    def on_train_batch_end(self, outputs, batch: Batch, batch_idx: int) -> None:
        self._epoch_seconds += time.perf_counter() - self._step_start  # forward..optimizer step

    def on_train_epoch_end(self) -> None:
        tokens = int(self._epoch_tokens)
        self.log("train_tgt_tok_per_s", tokens / max(self._epoch_seconds, 1e-9))
        self.totals["tgt_tokens"] += tokens
        self.totals["step_seconds"] += self._epoch_seconds
        self._epoch_tokens, self._epoch_seconds = 0, 0.0

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        now = time.perf_counter()
        totals = dict(self.totals)
        totals["wall_seconds"] += now - self._fit_start
        totals["tgt_tokens"] += int(self._epoch_tokens)  # a checkpoint inside an epoch
        totals["step_seconds"] += self._epoch_seconds
        checkpoint["nmt_totals"] = totals
        checkpoint["nmt_segments"] = self.segments
        checkpoint["nmt_validated_step"] = self.validated_step  # a finished run is not re-validated

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.totals = dict(checkpoint.get("nmt_totals", self.totals))
        # A checkpoint from before segments were kept: what trained it is unknown, not absent.
        unknown = {"from_step": 0, "code": None, "device": None, "precision": None, "started": None}
        self.segments = list(checkpoint.get("nmt_segments", [unknown]))
        self.validated_step = checkpoint.get("nmt_validated_step", -1)

    def on_validation_epoch_start(self) -> None:
        self._val_hyps, self._val_idx = [], []
        self._val_loss = torch.zeros(2, device=self.device)  # [loss sum, tokens]

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        loss, tokens = self._loss(batch, 0.0)
        self._val_loss += torch.stack([loss * tokens, tokens.float()])
        hyps = greedy_search(self.model, batch.src, batch.src_mask, self.decoding.max_len_ratio)
        self._val_hyps += self.tokenizer.decode([h.tokens for h in hyps])
        self._val_idx += batch.idx.tolist()

    def on_validation_epoch_end(self) -> None:
        refs = [self.val_references[i] for i in self._val_idx]
        stats = torch.tensor(bleu_statistics(self._val_hyps, refs), device=self.device)
        # Each rank decoded its share of the set; add counts, then score once.
        stats = self.trainer.strategy.reduce(stats, reduce_op="sum")
        val_loss = self.trainer.strategy.reduce(self._val_loss, reduce_op="sum")
        self.log("val_loss", val_loss[0] / val_loss[1].clamp(min=1), prog_bar=True)
        self.log("val_bleu", bleu_from_statistics(stats.tolist()), prog_bar=True)
        self.validated_step = self.global_step
        # Wall-clock minutes since the run began (resumed segments included): learning curves.
        minutes = (self.totals["wall_seconds"] + time.perf_counter() - self._fit_start) / 60
        self.log("wall_minutes", minutes)

    def _fused_adam(self) -> bool:
        """Adam's fused kernel updates every parameter in one pass instead of ~10 operators
        per parameter tensor: a bf16 Transformer step ran 1.015x faster (2-core AMD EPYC
        Zen 4, docs/performance.md). Not under fp16's gradient scaler: its fused step unscales the
        gradients itself, after Lightning has clipped them still scaled."""
        return self.device.type in ("cpu", "cuda") and self.trainer.precision != "16-mixed"

    def configure_optimizers(self):
        optim = self.optim
        optimizer = torch.optim.Adam(
            self.parameters(), lr=optim.lr, betas=tuple(optim.betas),
            weight_decay=optim.weight_decay, fused=self._fused_adam(),
        )
        if optim.schedule == "constant":
            return optimizer
        if optim.schedule == "inverse_sqrt":
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, inverse_sqrt(optim.warmup_steps))
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
        if optim.schedule == "cosine":
            factor = warmup_cosine(optim.warmup_steps, budget_horizon(self.trainer),
                                   optim.min_lr / optim.lr)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="max", factor=optim.plateau_factor,
            patience=optim.plateau_patience, min_lr=optim.min_lr,
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "val_bleu"}}


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write to a temporary file and rename: a killed run never leaves a truncated checkpoint."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        torch.save(checkpoint, tmp)
        os.replace(tmp, path)


def _max_time(value: str | None) -> str | None:
    """Accept HH:MM:SS (or DD:HH:MM:SS, Lightning's own form)."""
    if value is None:
        return None
    parts = value.split(":")
    if len(parts) not in (3, 4) or not all(p.isdigit() for p in parts):
        raise NMTError(f"--max-time must be HH:MM:SS, got '{value}'")
    return ":".join(["00"] * (4 - len(parts)) + parts)


# Options that may change between the segments of a resumed run: budgets, validation and
# logging cadence, loader processes, decoding. Every other option decides the trajectory.
RESUMABLE_CHANGES = {
    "name", "run_dir", "data.num_workers", "data.eval_max_tokens", "trainer.max_epochs",
    "trainer.max_steps", "trainer.max_time", "trainer.val_check_interval",
    "trainer.log_every_n_steps", "trainer.early_stopping_patience",
    "trainer.enable_progress_bar", "trainer.keep_last_checkpoints",
}


def _flat(tree: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}"""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _check_resumable(config: Config, run_dir: Path) -> Path | None:
    """last.ckpt if the run directory holds an earlier segment of this run; an error naming
    the first option that differs if it was trained with other trajectory options, and one
    if it holds checkpoints that cannot be resumed (a new run would overwrite them)."""
    last = run_dir / "last.ckpt"
    saved = run_dir / "config.yaml"
    if not last.is_file() or not saved.is_file():
        if earlier := sorted(str(path.relative_to(run_dir)) for path in run_dir.rglob("*.ckpt")):
            raise NMTError(f"{run_dir} holds checkpoints ({', '.join(earlier)}) of a run that "
                           "cannot be resumed (that needs last.ckpt and config.yaml); choose "
                           "another --run-dir, or move them away")
        return None
    before, now = _flat(yaml.safe_load(saved.read_text())), _flat(to_dict(config))
    # An option added after the run was saved did, at its built-in default, what the run did.
    defaults = _flat(to_dict(Config()))
    before.update((key, defaults[key]) for key in now.keys() - before.keys() if key in defaults)
    for key in sorted(before.keys() | now.keys()):
        if key not in RESUMABLE_CHANGES and key.split(".")[0] != "decoding" \
                and before.get(key) != now.get(key):
            raise NMTError(
                f"{run_dir} holds a run trained with {key}={before.get(key)!r}, not "
                f"{now.get(key)!r}; resume it with the same value, or choose another --run-dir"
            )
    return last


class StopAtStepBudget(L.Callback):
    """Ends a step budget the way Lightning ends a time budget, by ``should_stop``: the last
    stretch is then validated and checkpointed inside the loop, in a state that resumes in the
    middle of the epoch (a checkpoint written after ``fit`` would mark the epoch finished)."""

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if 0 < trainer.max_steps <= trainer.global_step:
            trainer.should_stop = True


class DropoutForBudget(L.Callback):
    """Residual dropout chosen by the number of epochs the budget buys.

    How much dropout pays depends on how long the model trains: the default Transformer on
    Multi30k was still underfitting at 4-10 epochs, where dropout 0.1 beat 0.2, and overfit
    with 0.1 by 14-16, where 0.2 won by 1.7 BLEU (docs/performance.md). A time budget buys
    more epochs on a faster machine, so no one value suits every machine. This callback
    trains the first epoch with the model's dropout, then reads the budget's end
    (``budget_horizon``: max_steps, max_epochs, or max_time at the speed of that epoch) and,
    if it lies at least ``long_epochs`` epochs out, sets ``long_dropout`` for the rest of
    the run (``set_dropout`` of the model). The decision is made once, printed, and kept in
    checkpoints, so a resumed run keeps it.
    """

    def __init__(self, long_dropout: float, long_epochs: float):
        self.long_dropout, self.long_epochs = long_dropout, long_epochs
        self.decided, self.switched = False, False

    def state_dict(self) -> dict:
        return {"decided": self.decided, "switched": self.switched}

    def load_state_dict(self, state_dict: dict) -> None:
        self.decided, self.switched = state_dict["decided"], state_dict["switched"]

    def budget_epochs(self, trainer: L.Trainer) -> float:
        """The epochs the budget buys, as known now."""
        return budget_horizon(trainer)(trainer.global_step) / steps_per_epoch(trainer)

    def on_train_epoch_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if not self.decided and trainer.current_epoch >= 1:
            self.decided = True
            epochs = self.budget_epochs(trainer)
            self.switched = epochs >= self.long_epochs
            if trainer.is_global_zero:
                choice = (f"dropout {self.long_dropout} from now on" if self.switched
                          else "the model's dropout kept")
                print(f"\nthe budget buys {epochs:.1f} epochs (long run: {self.long_epochs:g} or "
                      f"more): {choice}", flush=True)
        if self.switched:
            module.model.set_dropout(self.long_dropout)


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
      (``_check_resumable`` refuses to train a new run over checkpoints it cannot resume);
    - "Precision bf16-mixed is not supported by the model summary": the size it estimates is
      the fp32 weights', which is what they are under mixed precision;
    - the FutureWarning torch 2.13 raises at Lightning 2.6's own use of ``LeafSpec``;
    - its tip to install a cloud logger.

    Warnings are filtered as Lightning's docs show, the tip on Lightning's rank-zero logger
    (adding the same filter twice keeps one)."""
    for message in (".*Consider increasing the value of the `num_workers` argument",
                    "Checkpoint directory .* exists and is not empty",
                    r"Precision \S+-mixed is not supported by the model summary"):
        warnings.filterwarnings("ignore", message)
    warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                            category=FutureWarning)
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_DROP_TIP)


def training_callbacks(config: Config, run_dir: Path) -> list[L.Callback]:
    """best.ckpt, last.ckpt, the step budget, and the options' callbacks (early stopping,
    weight EMA, the last N checkpoints kept, dropout by the budget's epochs)."""
    t = config.trainer
    # Checkpoints and early stopping act after each validation (once per epoch, or every
    # trainer.val_check_interval batches): patience counts validations.
    metric = t.best_metric
    callbacks = [
        ModelCheckpoint(
            dirpath=run_dir, filename="best", monitor=metric, mode=BEST_METRICS[metric],
            save_top_k=1, enable_version_counter=False, save_on_train_epoch_end=False,
        ),
        # Lightning's save_last only writes when "best" does; this one writes every validation.
        ModelCheckpoint(dirpath=run_dir, filename="last", enable_version_counter=False,
                        save_on_train_epoch_end=False),
        StopAtStepBudget(),
    ]
    if t.early_stopping_patience > 0:
        callbacks.append(EarlyStopping(monitor=metric, mode=BEST_METRICS[metric],
                                       patience=t.early_stopping_patience,
                                       check_on_train_epoch_end=False))
    if config.optim.ema_decay > 0:
        callbacks.append(WeightEMA(config.optim.ema_decay))
    if t.keep_last_checkpoints > 0:
        callbacks.append(keep_last_callback(run_dir, t.keep_last_checkpoints))
    if config.optim.long_run_dropout is not None:
        callbacks.append(DropoutForBudget(config.optim.long_run_dropout,
                                          config.optim.long_run_epochs))
    return callbacks


def build_trainer(config: Config, run_dir: Path) -> L.Trainer:
    t = config.trainer
    precision, precision_plugins = trainer_precision(training_precision(config), t.accelerator)
    quiet_lightning_noise()
    once_per_epoch = isinstance(t.val_check_interval, float) and t.val_check_interval == 1.0
    return L.Trainer(
        default_root_dir=run_dir,
        max_epochs=t.max_epochs,
        max_steps=t.max_steps,
        max_time=_max_time(t.max_time),
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
        use_distributed_sampler=False,  # our batch sampler shards batches across ranks itself
        logger=CSVLogger(run_dir, name="logs"),  # logs/version_N: a resumed run adds a version
        # A fresh sampler each epoch, seeded by the epoch (Lightning's set_epoch does not reach
        # a batch sampler), so resumed and uninterrupted runs see the same batches.
        reload_dataloaders_every_n_epochs=1,
        callbacks=training_callbacks(config, run_dir),
        plugins=[AtomicCheckpointIO(), *precision_plugins],
        num_sanity_val_steps=0,
    )


def check_training_config(config: Config) -> None:
    """One-line errors for options that would fail only after data preparation, or never."""
    check_model_config(config.model)
    _max_time(config.trainer.max_time)
    if config.optim.schedule not in SCHEDULES:
        raise NMTError(f"unknown schedule '{config.optim.schedule}'; choose one of: "
                       f"{', '.join(SCHEDULES)}")
    if config.trainer.best_metric not in BEST_METRICS:
        raise NMTError(f"unknown trainer.best_metric '{config.trainer.best_metric}'; choose one "
                       f"of: {', '.join(BEST_METRICS)}")
    if not config.optim.lr > 0:
        raise NMTError(f"optim.lr must be above 0, got {config.optim.lr}")
    if config.trainer.early_stopping_patience < 0:
        raise NMTError(f"trainer.early_stopping_patience {config.trainer.early_stopping_patience}: "
                       "give the validations to wait, or 0 to train to the end of the budget")
    if config.optim.schedule == "cosine" and config.trainer.max_steps <= 0 \
            and config.trainer.max_epochs <= 0 and config.trainer.max_time is None:
        raise NMTError("schedule cosine decays to the end of the budget: set trainer.max_steps, "
                       "trainer.max_epochs or --max-time")


def train(config: Config) -> Path:
    """Train (or resume) the configured model; returns the run directory."""
    check_training_config(config)  # fail on bad options now, not after data preparation
    run_dir = run_dir_of(config)
    resume_from = _check_resumable(config, run_dir)
    L.seed_everything(config.seed, workers=True, verbose=False)
    data = prepare_data(config.data)
    model = build_model(config.model, len(data.tokenizer))
    long_dropout = config.optim.long_run_dropout
    if long_dropout is not None and not (0 <= long_dropout < 1 and hasattr(model, "set_dropout")):
        raise NMTError(f"optim.long_run_dropout {long_dropout} needs a value in [0, 1) and a model "
                       f"with set_dropout ({type(model).__name__})")
    if config.data.max_len >= model.max_positions:
        raise NMTError(f"data.max_len {config.data.max_len} must be below the model's "
                       f"max_positions {model.max_positions}")
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(config, run_dir / "config.yaml")
    shutil.copyfile(data.tokenizer.model_file, run_dir / "spm.model")
    module = TranslationModule(
        model, data.tokenizer, config.optim, config.decoding,
        list(data.text["val"]["tgt"]), config.seed,
    )
    trainer = build_trainer(config, run_dir)
    datamodule = TranslationDataModule(data, config.data, config.seed, model.max_positions)
    print_effective_batch(config, trainer)
    if trainer.is_global_zero:
        forget_final_weights(run_dir)
    trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)
    metric = config.trainer.best_metric  # what best.ckpt's callback monitored
    best = finish_last_epoch(trainer, module, datamodule, run_dir, metric)
    if trainer.is_global_zero:
        weights, why = final_weights(run_dir, config.trainer.keep_last_checkpoints)
        stats = write_train_stats(run_dir, module, trainer, metric, best, weights)
        print_run_summary(stats, trainer.callback_metrics)
        print(f"translate and evaluate use {weights}: {why}", flush=True)
    return run_dir


def finish_last_epoch(trainer: L.Trainer, module: TranslationModule,
                      datamodule: TranslationDataModule, run_dir: Path, metric: str) -> float | None:
    """The best ``metric`` of the run, after its last epoch is validated and checkpointed.

    Budgets that stop inside an epoch were validated and checkpointed in the loop
    (StopAtStepBudget). At an epoch's end, validate it if trainer.val_check_interval batches
    left it unvalidated, and write last.ckpt as a finished epoch."""
    best = trainer.checkpoint_callback.best_model_score
    best = float(best) if best is not None else None
    if datamodule.epoch_finished():
        if module.validated_step < trainer.global_step:
            score = trainer.validate(module, datamodule=datamodule, verbose=False)[0][metric]
            if best is None or is_better(score, best, metric):
                trainer.save_checkpoint(run_dir / "best.ckpt", weights_only=False)
                best = score
        trainer.save_checkpoint(run_dir / "last.ckpt", weights_only=False)  # a whole, resumable one
    return best


def is_better(score: float, best: float, metric: str) -> bool:
    """Whether ``score`` beats ``best`` in ``metric``'s direction (BEST_METRICS)."""
    return score < best if BEST_METRICS[metric] == "min" else score > best


def print_effective_batch(config: Config, trainer: L.Trainer) -> None:
    """One line at start: the tokens behind each optimizer step, across all processes."""
    if trainer.is_global_zero:
        t, tokens = config.trainer, config.data.max_tokens
        total = trainer.world_size * tokens * t.accumulate_grad_batches
        print(f"effective batch: {trainer.world_size} processes ({trainer.num_devices} devices x "
              f"{trainer.num_nodes} nodes) x {tokens} tokens x {t.accumulate_grad_batches} "
              f"accumulated = {total} padded tokens per optimizer step (lr {config.optim.lr})",
              flush=True)


def forget_final_weights(run_dir: Path) -> None:
    """Drop a resumed run's earlier choice of weights from train_stats.json: until it ends and
    chooses again, translation takes best.ckpt (steps/ and averaged.ckpt may be stale)."""
    stats_file = run_dir / "train_stats.json"
    try:
        stats = json.loads(stats_file.read_text())
    except (OSError, ValueError):  # none yet, or unreadable: rewritten at the end
        return
    if isinstance(stats, dict) and stats.pop("final_weights", None) is not None:
        write_atomic(stats_file, json.dumps(stats, indent=2) + "\n")


def write_train_stats(run_dir: Path, module: TranslationModule, trainer: L.Trainer,
                      metric: str, best: float | None, weights: str) -> dict:
    """train_stats.json: the run's totals (all resumed segments), read by ``compare``, and the
    weights file that translate and evaluate take by default (``final_weights``). Returns
    what it wrote."""
    last = torch.load(run_dir / "last.ckpt", map_location="cpu", weights_only=False)
    totals = last["nmt_totals"]
    stats = {
        "wall_seconds": round(totals["wall_seconds"], 1),
        "train_step_seconds": round(totals["step_seconds"], 1),
        "tgt_tokens": totals["tgt_tokens"],
        "tgt_tok_per_s": round(totals["tgt_tokens"] / max(totals["step_seconds"], 1e-9), 1),
        "steps": trainer.global_step,
        "epochs": trainer.current_epoch,
        "parameters": sum(p.numel() for p in module.model.parameters()),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        f"best_{metric}": round(best, 4) if best is not None else None,  # best.ckpt's
        "world_size": trainer.world_size,
        "segments": last.get("nmt_segments", []),
        "final_weights": weights,
    }
    write_atomic(run_dir / "train_stats.json", json.dumps(stats, indent=2) + "\n")
    return stats


def print_run_summary(stats: dict, metrics: dict[str, torch.Tensor]) -> None:
    """One line at the end of training: its updates and speed (all segments) and the last
    validation's scores (Lightning's latest logged metrics). No epoch count: Lightning counts
    an epoch that a step or time budget stopped as finished."""
    scores = ", ".join(f"{name} {float(value):.2f}" for name, value in sorted(metrics.items())
                       if name.startswith("val_"))
    print(f"trained {stats['steps']:,} updates at "
          f"{stats['tgt_tok_per_s']:,.0f} tgt tok/s" + (f"; last validation: {scores}" if scores else ""),
          flush=True)
