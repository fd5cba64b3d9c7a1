"""Training with Lightning: a thin LightningModule around any ``Seq2Seq`` model, and
``train(config)``, a plain function that prepares data, builds the model and runs the Trainer
(``nmt.trainer``).

The run directory holds everything needed later: config.yaml and spm.model; best.ckpt and
last.ckpt (and, with trainer.keep_last_checkpoints, steps/ and averaged.ckpt); the metrics in
logs/version_N/metrics.csv (a resumed run adds a version); train_data.json, the training
pairs a resume compares; and train_stats.json, which names the weights that translate and
evaluate take. Re-running the same command resumes from
last.ckpt (``nmt.resume``).
"""

from __future__ import annotations

import datetime
import json
import math
import shutil
import signal
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.optim.lr_scheduler import ReduceLROnPlateau

from nmt.average import final_weights
from nmt.callbacks import StopOnSignals, validation_on_cadence
from nmt.config import (
    Config,
    DecodingConfig,
    OptimConfig,
    absolute_file_paths,
    run_dir_of,
    save_config,
)
from nmt.config_checks import check_training_config, max_time
from nmt.data.batching import Batch, TokenBatchSampler
from nmt.data.corpus import local_sources, split_sources
from nmt.data.hub import resolve_hub
from nmt.data.module import (
    PreparedData,
    TranslationDataModule,
    prepare_data,
    training_pairs_note,
)
from nmt.data.prepare import check_prepared_text
from nmt.data.tokenizer import PAD, Tokenizer
from nmt.errors import NMTError, stop_signals_by_default
from nmt.files import write_atomic
from nmt.loss import smoothed_cross_entropy
from nmt.memory import peak_memory_mb
from nmt.metrics import bleu_from_statistics, bleu_statistics
from nmt.models import build_model
from nmt.processes import how_it_ended
from nmt.provenance import code_commit, device_name
from nmt.resume import (
    budget_ended,
    check_resumable,
    check_training_data,
    check_vocabulary,
    decoding_changes,
    drop_undone_metrics,
    epochs_past,
    forget_finished,
    kept_precision,
    load_mapped,
    out_of_patience,
    record_training_data,
    run_lock,
    time_spent,
)
from nmt.run_identity import IDENTITY_KEY, run_identity
from nmt.schedules import SCHEDULERS, steps_per_epoch
from nmt.search import greedy_search
from nmt.trainer import build_trainer, check_device_options


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
        identity: dict[str, str] | None = None,
    ):
        """``identity``: the run's (``nmt.run_identity``), written into every checkpoint so that
        loaders refuse it in another run; None (benchmarks) writes none."""
        super().__init__()
        self.model, self.tokenizer = model, tokenizer
        self.optim, self.decoding = optim, decoding
        self.val_references, self.seed = val_references, seed
        self.identity = identity
        # Totals of the epochs ended so far, resumed segments included, and the wall time of
        # the segments before this one (kept in checkpoints); ``run_totals`` adds the rest.
        self.totals = {"tgt_tokens": 0, "step_seconds": 0.0, "wall_seconds": 0.0}
        # One entry per training segment (a resume starts a new one): the code and device it
        # ran on, so that results name everything that produced their weights.
        self.segments: list[dict] = []
        self._fit_start = time.perf_counter()
        self._epoch_tokens, self._epoch_seconds = 0, 0.0
        # Whether the last batch took no optimizer step: its gradients wait for the rest of
        # its group of trainer.accumulate_grad_batches batches (see _pending_gradients).
        self._gradients_pending = False
        self._steps_before_batch = 0
        self._restored_gradients: list[torch.Tensor | None] | None = None
        self._segment_noted = False  # see _note_segment

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
        # A resumed group's next batch adds to its saved sums (Lightning zeroes gradients at a
        # group's first batch, and once before training starts: they are put back after that).
        for param, grad in zip(self.parameters(), self._restored_gradients or []):
            param.grad = None if grad is None else grad.to(param.device)
        self._restored_gradients = None
        self._segment_noted = False

    def _note_segment(self) -> None:
        """This fit as a training segment of the run, at its first batch: a resumed run with
        nothing left to train (its last epoch ended after its last checkpoint) trained nothing
        here, and its device and code trained none of the weights."""
        self.segments.append({
            "from_step": self.global_step, "code": code_commit(), "device": device_name(),
            "precision": str(self.trainer.precision),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")})
        self._segment_noted = True

    def on_train_epoch_start(self) -> None:
        self._epoch_tokens, self._epoch_seconds = 0, 0.0

    def on_train_batch_start(self, batch: Batch, batch_idx: int) -> None:
        if not self._segment_noted:
            self._note_segment()
        # Dropout draws depend only on (seed, epoch, batch, rank), so a resumed run continues
        # exactly like an uninterrupted one, whatever else drew random numbers meanwhile.
        torch.manual_seed(hash((self.seed, self.current_epoch, batch_idx, self.global_rank)))
        # The loggers' step is the updates taken (one optimizer). Lightning restores it one
        # behind from a checkpoint written inside an epoch (its restart compensation skips that
        # case), which labelled a resumed run's metrics.csv rows one update early.
        self.trainer.fit_loop.epoch_loop._batches_that_stepped = self.global_step
        self._steps_before_batch = self.global_step
        self._step_start = time.perf_counter()

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        loss, tokens = self._loss(batch, self.optim.label_smoothing)
        self._epoch_tokens += tokens.detach()  # a tensor: no device sync per step
        self.log("train_loss", loss, prog_bar=True, batch_size=batch.src.size(0))
        self.log("lr", self.optimizers().param_groups[0]["lr"], batch_size=batch.src.size(0))
        return loss

    def on_train_batch_end(self, outputs, batch: Batch, batch_idx: int) -> None:
        self._epoch_seconds += time.perf_counter() - self._step_start  # forward..optimizer step
        self._gradients_pending = self.global_step == self._steps_before_batch

    def on_train_epoch_end(self) -> None:
        tokens = self._epoch_tokens_of_all_processes()
        if tokens:  # none where a resumed run starts at its epoch's end: no speed to log
            self.log("train_tgt_tok_per_s", tokens / max(self._epoch_seconds, 1e-9))
        self.totals["tgt_tokens"] += tokens
        self.totals["step_seconds"] += self._epoch_seconds
        self._epoch_tokens, self._epoch_seconds = 0, 0.0

    def _epoch_tokens_of_all_processes(self) -> int:
        """The running epoch's target tokens, summed over the processes: under DDP each trains
        on its own share of the batches. A collective, so every process calls it; the seconds
        stay each process's own, as the processes wait for each other at every step."""
        # on the strategy's device: after fit Lightning has moved the module to the CPU, and
        # NCCL reduces only CUDA tensors
        tokens = torch.tensor(int(self._epoch_tokens), device=self.trainer.strategy.root_device)
        return int(self.trainer.strategy.reduce(tokens, reduce_op="sum"))

    def run_totals(self) -> dict:
        """The whole run's totals so far, resumed segments and the running epoch included:
        target tokens (of all processes: every process calls this), seconds in training
        steps, and wall-clock seconds."""
        return {"tgt_tokens": self.totals["tgt_tokens"] + self._epoch_tokens_of_all_processes(),
                "step_seconds": self.totals["step_seconds"] + self._epoch_seconds,
                "wall_seconds": self.wall_seconds()}

    def wall_seconds(self) -> float:
        """Wall-clock seconds of the whole run so far, validation and resumed segments included."""
        return self.totals["wall_seconds"] + time.perf_counter() - self._fit_start

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["nmt_totals"] = self.run_totals()
        checkpoint["nmt_segments"] = self.segments
        if self.identity is not None:
            checkpoint[IDENTITY_KEY] = self.identity
        # Each process a whole copy of the weights (one device, DDP itself): a sharded
        # strategy's pieces (FSDP; DeepSpeed, which subclasses DDPStrategy) are not to be
        # averaged, and its group restarts empty on resume, as Lightning's does
        whole = self.trainer.world_size == 1 or type(self.trainer.strategy) is DDPStrategy
        if self._gradients_pending and whole:
            checkpoint["nmt_pending_gradients"] = self._pending_gradients()

    def _pending_gradients(self) -> list[torch.Tensor | None]:
        """The gradients summed so far in an accumulation group that a checkpoint interrupts
        (a validation or a time budget inside it), for a resumed run to go on summing into:
        Lightning keeps none, so its group ended short and every later weight moved. Under DDP
        each process holds its own sum until the group's step averages them; that step is
        linear in them, so processes that all resume from their mean step alike."""
        grads = [None if p.grad is None else p.grad.detach().clone() for p in self.parameters()]
        if self.trainer.world_size > 1:
            for grad in grads:
                if grad is not None:
                    torch.distributed.all_reduce(grad)  # every process saves: a collective
                    grad /= self.trainer.world_size
        return grads

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.totals = dict(checkpoint.get("nmt_totals", self.totals))
        # A checkpoint from before segments were kept: what trained it is unknown, not absent.
        unknown = {"from_step": 0, "code": None, "device": None, "precision": None, "started": None}
        self.segments = list(checkpoint.get("nmt_segments", [unknown]))
        self._restored_gradients = checkpoint.get("nmt_pending_gradients")

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
        loss = val_loss[0] / val_loss[1].clamp(min=1)
        if not torch.isfinite(loss) and self.trainer.state.fn == TrainerFn.FITTING:
            # Diverged: stop before this validation's checkpoints are written (weights that are
            # NaN decode nothing). Every process has the same reduced loss, so all stop.
            raise NMTError(f"training diverged: validation loss {loss.item()} at update "
                           f"{self.global_step}; train again with a lower optim.lr or clipped "
                           "gradients (trainer.gradient_clip_val), in a new --run-dir if this one "
                           "has checkpoints (those of the validation before)")
        self.log("val_loss", loss, prog_bar=True)
        bleu = bleu_from_statistics(stats.tolist())
        self.log("val_bleu", bleu, prog_bar=True)
        self.step_plateau(bleu)
        # Wall-clock minutes since the run began (resumed segments included): learning curves.
        self.log("wall_minutes", self.wall_seconds() / 60)

    def step_plateau(self, bleu: float) -> None:
        """The plateau schedule weighs every validation of the cadence (``lr_scheduler_step``
        leaves it to this), not one that a budget ending there added (``validation_on_cadence``)."""
        if self.trainer.state.fn == TrainerFn.FITTING and \
                isinstance(scheduler := self.lr_schedulers(), ReduceLROnPlateau) and \
                validation_on_cadence(self.trainer):
            scheduler.step(bleu)

    def lr_scheduler_step(self, scheduler, metric) -> None:
        """Lightning's stepping of the schedules, but for the plateau's (``step_plateau``)."""
        if not isinstance(scheduler, ReduceLROnPlateau):
            scheduler.step()

    def _fused_adam(self) -> bool:
        """Adam's fused kernel updates every parameter in one pass instead of ~10 operators
        per parameter tensor: a bf16 Transformer step ran 1.015x faster (2-core AMD EPYC
        Zen 4, docs/performance.md). Not under fp16's gradient scaler: its fused step unscales the
        gradients itself, after Lightning has clipped them still scaled."""
        return self.device.type in ("cpu", "cuda") and self.trainer.precision != "16-mixed"

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(
            self.parameters(), lr=self.optim.lr, betas=tuple(self.optim.betas),
            weight_decay=self.optim.weight_decay, fused=self._fused_adam(),
        )
        scheduler = SCHEDULERS[self.optim.schedule](optimizer, self.optim, self.trainer)
        return optimizer if scheduler is None else {"optimizer": optimizer, "lr_scheduler": scheduler}


def train(config: Config) -> Path:
    """Train (or resume) the configured model; returns the run directory."""
    check_training_config(config)  # fail on bad options now, not after data preparation
    absolute_file_paths(config)
    run_dir = run_dir_of(config)
    if run_dir.exists() and not run_dir.is_dir():
        raise NMTError(f"--run-dir {run_dir} is a file; name a folder")
    processes = check_device_options(config)  # Lightning's checks, before anything is written
    with run_lock(run_dir, processes):
        train_into(config, run_dir)
    return run_dir


def train_into(config: Config, run_dir: Path) -> None:
    """``train`` once ``run_dir`` is this process's to write."""
    resume_from = check_resumable(config, run_dir)
    if resume_from is not None and nothing_to_train(config, resume_from):
        return
    # A corpus that cannot be found (no local files, the Hub unreachable): one line, before
    # the precision probe's and the Trainer's lines. A Hub dataset's files are resolved
    # here, and downloaded (once; the first time may take hours) only after the Trainer has
    # checked the rest of the options.
    local = local_sources(config.data)
    hub = resolve_hub(config.data) if local is None else None
    kept = None if resume_from is None else kept_precision(load_mapped(resume_from))
    trainer = build_trainer(config, run_dir, kept)
    sources = local if local is not None else split_sources(config.data, hub=hub)
    data = prepare_data(config.data, sources)
    references = list(data.text["val"]["tgt"])
    if not references:  # else it fails at the first validation, after training
        raise NMTError("the validation split is empty: training validates and keeps checkpoints by it")
    sides = {config.data.src_lang: list(data.text["val"]["src"]), config.data.tgt_lang: references}
    check_prepared_text(data.folder, "val", sides)  # before the run's files are written
    L.seed_everything(config.seed, workers=True, verbose=False)  # the weights: the seed's alone
    model = build_model(config.model, len(data.tokenizer))
    if resume_from is not None:  # before anything of the run is replaced
        check_vocabulary(run_dir, data.tokenizer)
        check_training_data(run_dir, data)
        if (changes := decoding_changes(config, run_dir)) and trainer.is_global_zero:
            print(changes, flush=True)  # before write_run_files saves the new ones
    datamodule = TranslationDataModule(data, config.data, config.seed, model.max_positions)
    check_batches_per_process(datamodule, config, trainer.world_size)
    write_run_files(config, run_dir, data, new_run=resume_from is None)
    module = TranslationModule(model, data.tokenizer, config.optim, config.decoding, references,
                               config.seed, run_identity(config, data.tokenizer))
    print_effective_batch(config, trainer)
    print_model_size(model, trainer)
    if trainer.is_global_zero:
        note = training_pairs_note(data, config.data.max_len)
        if note is not None:  # pairs left out: say so, once
            print(note, flush=True)
        forget_finished(run_dir)
        # a new run's directory holds the logs of earlier starts only if they left no checkpoint
        drop_undone_metrics(run_dir, 0 if resume_from is None else
                            load_mapped(resume_from)["global_step"])
    try:
        fit(trainer, module, datamodule, resume_from)
        finish_run(config, run_dir, trainer, module)
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # Lightning leaves the group to the process's exit, where a DDP worker tearing it
            # down aborted about every other run ("terminate called without an active exception").
            torch.distributed.destroy_process_group()


def write_run_files(config: Config, run_dir: Path, data: PreparedData, new_run: bool) -> None:
    """What the run directory holds before training, once nothing is left to check:
    config.yaml (the segment's options), a new run's spm.model, and train_data.json."""
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(config, run_dir / "config.yaml")
    if new_run:
        shutil.copyfile(data.tokenizer.model_file, run_dir / "spm.model")
    record_training_data(run_dir, data, new_run)


def finish_run(config: Config, run_dir: Path, trainer: L.Trainer, module: TranslationModule) -> None:
    """After ``fit``, once: the weights translate takes (``final_weights``), train_stats.json
    and the run's summary. last.ckpt stays the one written at the last validation, inside the
    loop: also where that was an epoch's last batch, as Lightning resumes it exactly (a
    checkpoint written after ``fit`` as a finished epoch skipped the next one where a resumed
    run had a step budget)."""
    totals = module.run_totals()  # on every process: it sums their tokens
    if trainer.is_global_zero:
        weights, why = final_weights(run_dir, config.trainer.keep_last_checkpoints)
        stats = write_train_stats(run_dir, totals, module, trainer, config.trainer.best_metric,
                                  weights)
        print_run_summary(stats, trainer.callback_metrics, trainer.early_stopping_callback)
        print(f"translate and evaluate use {weights}: {why}", flush=True)


def nothing_to_train(config: Config, last: Path) -> bool:
    """Whether the run of ``last`` has nothing left to train, out of the early stopping
    patience given now (``out_of_patience``), past its epoch budget (``epochs_past``), at the
    end of the step or epoch budget it finished (``budget_ended``) or out of its time budget
    (``time_spent``); if so, says why, once."""
    checkpoint = load_mapped(last)
    t = config.trainer
    why = None
    if (waited := out_of_patience(checkpoint, t.early_stopping_patience)) is not None:
        why = (f"at update {waited[0]:,} the run's {t.best_metric} has not improved for "
               f"{waited[1]} validations, at least trainer.early_stopping_patience "
               f"{t.early_stopping_patience} (raise it, or set 0, to train on)")
    elif (epochs := epochs_past(checkpoint, t.max_epochs)) is not None:
        why = (f"the run has trained into epoch {epochs + 1} (to update "
               f"{checkpoint['global_step']:,}), past --max-epochs {t.max_epochs}: raise it to "
               "train on")
    elif (ended := budget_ended(last.parent, checkpoint, t.max_steps, t.max_epochs)) is not None:
        why = (f"the run has finished its {ended[0]} ({ended[1]}, to update "
               f"{checkpoint['global_step']:,}): raise it to train on")
    elif (spent := time_spent(checkpoint, max_time(t.max_time))) is not None:
        why = (f"the run has trained for {datetime.timedelta(seconds=round(spent))} of its "
               f"--max-time {t.max_time} (every segment counts, validations too): raise it "
               "to train on")
    if why is not None and rank_zero_only.rank == 0:
        print(f"nothing to train: {why}", flush=True)
    return why is not None


def check_batches_per_process(datamodule: TranslationDataModule, config: Config,
                              processes: int) -> None:
    """One-line errors, before the run directory is made, where a process would have no
    training batch: no pair left (``training_pairs_note``), or fewer batches than processes
    (each trains on its own share of the batches, of which a whole number each is kept); or
    no validation sentence (each decodes every processes-th one)."""
    if len(datamodule.train_set) == 0:
        why = training_pairs_note(datamodule.data, config.data.max_len) or "the training split is empty"
        raise NMTError(f"no training pair is left to train on: {why}")
    batches = len(TokenBatchSampler(datamodule.train_set.lengths(), config.data.max_tokens,
                                    shuffle=False))
    if batches < processes:
        raise NMTError(f"the training pairs make {batches} batch(es) of data.max_tokens "
                       f"{config.data.max_tokens}, fewer than the {processes} processes, each of "
                       "which trains on batches of its own: lower data.max_tokens, or train on "
                       "fewer devices")
    if len(datamodule.val_set) < processes:  # Lightning stops a process with no validation batch
        raise NMTError(f"the validation split has {len(datamodule.val_set)} pair(s), fewer than the "
                       f"{processes} processes, each of which validates on sentences of its own: "
                       "validate on more pairs, or train on fewer devices")


def fit(trainer: L.Trainer, module: TranslationModule, datamodule: TranslationDataModule,
        resume_from: Path | None) -> None:
    """``trainer.fit``, with its ends by a signal made ours: Lightning ends a run stopped by
    SIGTERM (a scheduler's pre-emption, ``kill``) or SIGHUP (``StopOnSignals``) with a bare
    SystemExit, i.e. exit status 0 as if it had finished, and one stopped by Ctrl-C with exit
    status 1. Under DDP the first process alone says so, once, and stops the processes it
    started (``stop_workers``); and where one of those ended (``ended_worker``), it says
    which, in one line, in place of the traceback of the collective that failed as it left."""
    try:
        with stop_signals_by_default():  # Lightning's and StopOnSignals' from here
            trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)
    except SIGTERMException:  # SIGTERM or SIGHUP (StopOnSignals), wherever the process was
        if not trainer.is_global_zero:
            raise SystemExit(1) from None
        stop_workers(trainer)
        stopped_by = next(c.stopped_by for c in trainer.callbacks if isinstance(c, StopOnSignals))
        raise NMTError(f"stopped by {stopped_by}: the same command resumes the run from its "
                       "last checkpoint") from None
    except SystemExit:
        if not trainer.interrupted:
            raise
        # the command line's "interrupted: ...", exit status 130; said as SIGTERM's line says
        # it, or a bare "interrupted" left the user to guess whether the run was lost
        raise KeyboardInterrupt("the same command resumes the run from its last checkpoint") from None
    except RuntimeError:  # a collective whose peer ended (gloo: "Connection closed by peer")
        if (ended := ended_worker(trainer)) is None:
            raise
        stop_workers(trainer)
        rank, exitcode = ended
        said = " without a word" if exitcode < 0 else ""  # killed; else its error is above
        raise NMTError(f"a training process (rank {rank}) ended{said} ({how_it_ended(exitcode)}): "
                       "the same command resumes the run from its last checkpoint") from None


def ended_worker(trainer: L.Trainer, wait: float = 1.0) -> tuple[int, int] | None:
    """The global rank and exit code of a process Lightning's DDP launcher started (this
    process, where it is that launcher) that has ended; None where none has. A process that
    ends fails its peers' collectives as its sockets close, a moment before it is gone: it is
    waited for up to ``wait`` seconds. A worker SIGKILLed (the OOM killer) ended the run with
    a traceback of ~40 lines from gloo, "Connection closed by peer", which said nothing of it."""
    workers = getattr(trainer.strategy.launcher, "procs", [])
    deadline = time.monotonic() + wait
    while workers:
        for local_rank, worker in enumerate(workers, start=1):  # the launcher's is 0
            if worker.poll() is not None:
                return trainer.global_rank + local_rank, worker.returncode
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return None


def stop_workers(trainer: L.Trainer) -> None:
    """Kill the processes Lightning's DDP launcher started (none elsewhere), as Lightning does
    after Ctrl-C: one that got no signal waits for this one in a collective, and would
    otherwise fail there when it leaves, with a traceback. Lightning's observer of them, a
    thread that looks at the launcher's list of them every 5 s, SIGKILLs this process too on
    seeing one that ended with an error, before it could say why the run stopped: the list
    is emptied once they have ended, and the observer, seeing none, ends instead."""
    launcher = trainer.strategy.launcher
    if launcher is not None:
        launcher.kill(signal.SIGKILL)
        workers = getattr(launcher, "procs", [])
        for worker in workers:
            worker.wait()
        workers.clear()


def print_effective_batch(config: Config, trainer: L.Trainer) -> None:
    """One line at start: the tokens behind each optimizer step, across all processes."""
    if trainer.is_global_zero:
        t, tokens = config.trainer, config.data.max_tokens
        total = trainer.world_size * tokens * t.accumulate_grad_batches
        print(f"effective batch: {trainer.world_size} processes ({trainer.num_devices} devices x "
              f"{trainer.num_nodes} nodes) x {tokens} tokens x {t.accumulate_grad_batches} "
              f"accumulated = {total} padded tokens per optimizer step (lr {config.optim.lr})",
              flush=True)


def print_model_size(model: torch.nn.Module, trainer: L.Trainer) -> None:
    """One line at start: the model's class and its parameters."""
    if trainer.is_global_zero:
        count = sum(p.numel() for p in model.parameters())
        print(f"model: {type(model).__name__}, {count:,} parameters "
              f"({count * 4 / 2**20:.1f} MiB in fp32)", flush=True)


def write_train_stats(run_dir: Path, totals: dict, module: TranslationModule, trainer: L.Trainer,
                      metric: str, weights: str) -> dict:
    """train_stats.json: the run's ``totals`` (``TranslationModule.run_totals``: all resumed
    segments, all processes), read by ``compare``, and the
    weights file that translate and evaluate take by default (``final_weights``). Returns
    what it wrote. ``epochs``: optimizer steps / steps per epoch, so a budget that stopped
    inside an epoch counts its part (Lightning's epoch counter counts it whole)."""
    per_epoch = steps_per_epoch(trainer)
    best = trainer.checkpoint_callback.best_model_score  # best.ckpt's; None if never validated
    stats = {
        "wall_seconds": round(totals["wall_seconds"], 1),
        "train_step_seconds": round(totals["step_seconds"], 1),
        "tgt_tokens": totals["tgt_tokens"],
        "tgt_tok_per_s": round(totals["tgt_tokens"] / max(totals["step_seconds"], 1e-9), 1),
        "steps": trainer.global_step,
        "epochs": epochs_trained(trainer.global_step, per_epoch) if math.isfinite(per_epoch) else None,
        "steps_per_epoch": per_epoch if math.isfinite(per_epoch) else None,
        "parameters": sum(p.numel() for p in module.model.parameters()),
        "peak_rss_mb": round(peak_memory_mb(), 1),
        f"best_{metric}": round(float(best), 4) if best is not None else None,
        "world_size": trainer.world_size,
        "segments": module.segments,
        "final_weights": weights,
    }
    write_atomic(run_dir / "train_stats.json", json.dumps(stats, indent=2) + "\n")
    return stats


def epochs_trained(steps: int, per_epoch: int) -> float:
    """``steps`` in epochs of ``per_epoch`` steps, to two decimals, or to two significant digits
    where less: 30 updates of a 2.5M-pair corpus (20,159 a epoch) are 0.0015 epochs, which two
    decimals made 0 (``trained 30 updates (0 epochs)``)."""
    epochs = steps / per_epoch
    return round(epochs, max(2, 1 - math.floor(math.log10(epochs)))) if epochs > 0 else 0.0


def print_run_summary(stats: dict, metrics: dict[str, torch.Tensor],
                      early_stopping: EarlyStopping | None) -> None:
    """One line at the end of training: its updates, epochs and speed (all segments) and the
    last validation's scores (Lightning's latest logged metrics); and one where early stopping
    ended it, with Lightning's reason."""
    if early_stopping is not None and early_stopping.stopping_reason_message:
        print(f"early stopping ended the run: {early_stopping.stopping_reason_message}", flush=True)
    scores = ", ".join(f"{name} {float(value):.2f}" for name, value in sorted(metrics.items())
                       if name.startswith("val_"))
    epochs = "" if stats["epochs"] is None else \
        f" ({stats['epochs']:g} epoch{'s' * (stats['epochs'] != 1)})"
    updates = f"{stats['steps']:,} update{'s' * (stats['steps'] != 1)}"
    print(f"trained {updates}{epochs} at {stats['tgt_tok_per_s']:,.0f} tgt tok/s"
          + (f"; last validation: {scores}" if scores else ""), flush=True)
