"""Resuming a run: re-running the same command continues from ``RUN/last.ckpt``.

A run directory is resumed only with the options that decided its trajectory so far; the
budgets, validation cadence and decoding may change between segments (``RESUMABLE_CHANGES``).
"""

from __future__ import annotations

import csv
import datetime
import fcntl
import hashlib
import inspect
import io
import json
import os
import socket
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import torch
import yaml

from nmt.average import step_checkpoints
from nmt.config import ADDED_SINCE, Config, read_yaml, to_dict
from nmt.data.module import PreparedData
from nmt.data.prepare import load_side
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NMTError, first_line
from nmt.files import remove_empty, write_atomic
from nmt.models import MODELS
from nmt.precision import PrecisionChoice, lightning_name
from nmt.provenance import device_name
from nmt.run_identity import check_identity, run_identity

# Options that may change between the segments of a resumed run: budgets, validation and
# logging cadence, loader processes, decoding. Every other option decides the trajectory.
RESUMABLE_CHANGES = {
    "name", "run_dir", "data.num_workers", "data.eval_max_tokens", "trainer.max_epochs",
    "trainer.max_steps", "trainer.max_time", "trainer.val_check_interval",
    "trainer.log_every_n_steps", "trainer.early_stopping_patience",
    "trainer.enable_progress_bar", "trainer.tensorboard", "trainer.keep_last_checkpoints",
}


# Where the corpus files are: saved absolute, so a moved project names them elsewhere (and a
# run saved before a local Hub folder was, relative). The training and validation pairs are
# compared by their content instead (check_training_data).
CORPUS_FILES = {"data.train_files", "data.val_files", "data.test_files", "data.data_dir",
                "data.hub_dataset"}


# Options named first where a run differs in several: another model family or language pair
# is the plainest reason a run directory is not this run's.
PLAINEST = ("model.family", "data.src_lang", "data.tgt_lang")


def _flat(tree: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}"""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_resumable(config: Config, run_dir: Path) -> Path | None:
    """last.ckpt if the run directory holds an earlier segment of this run; an error naming
    the first option that differs if it was trained with other trajectory options, one where
    last.ckpt is another run's (copied in: ``check_identity``), and one if it holds
    checkpoints that cannot be resumed (a new run would overwrite them)."""
    last = run_dir / "last.ckpt"
    saved = run_dir / "config.yaml"
    if not last.is_file() or not saved.is_file():
        refuse_to_overwrite(run_dir)
        return None
    now = _flat(to_dict(config))
    before = saved_options(run_dir, now)
    check_loadable(last)
    # Model options left out are the family's defaults, filled after ADDED_SINCE, which
    # covers only options the command gives: a command that leaves embed_init out resumes the
    # RNN it trained before the option existed (its checkpoint carries the embedding scale).
    before, now = with_model_defaults(before), with_model_defaults(now)
    for key in sorted(before.keys() | now.keys(), key=lambda k: (k not in PLAINEST, k)):
        if key not in RESUMABLE_CHANGES | CORPUS_FILES and key.split(".")[0] != "decoding" \
                and before.get(key) != now.get(key) and not _same_or_chosen_precision(key, before, now):
            raise NMTError(
                f"{run_dir} holds a run trained with {key}={before.get(key)!r}, not "
                f"{now.get(key)!r}; resume it with the same value, or choose another --run-dir"
            )
    if (run_dir / "spm.model").is_file():  # else check_vocabulary says it is missing
        identity = run_identity(config, Tokenizer(run_dir / "spm.model"))
        check_identity(load_mapped(last), identity, last, run_dir)
        check_kept_identities(run_dir, identity)
    return last


def check_kept_identities(run_dir: Path, identity: dict[str, str]) -> None:
    """A one-line error where a checkpoint the resumed run keeps beside last.ckpt (best.ckpt,
    averaged.ckpt, steps/) is another run's (``check_identity``): checking last.ckpt alone, a
    de->en best.ckpt copied into an en->de run trained on, stayed best.ckpt while no
    validation beat the score last.ckpt recorded, was named as the weights the run translates
    with, and then refused by translate. A file that cannot be read is left to what reads it
    (``final_weights`` says so at the run's end; translate and average refuse it)."""
    for path in [run_dir / "best.ckpt", run_dir / "averaged.ckpt", *step_checkpoints(run_dir)]:
        if not path.is_file():
            continue
        try:
            checkpoint = load_mapped(path)
        except Exception:  # unpickling, a zip archive cut short, an empty file, ...
            continue
        check_identity(checkpoint, identity, path, run_dir)


def saved_options(run_dir: Path, now: dict) -> dict:
    """The flat options of the run's config.yaml (its last segment's), with those of the
    flat options ``now`` that were added since it was saved at what the run did: ADDED_SINCE
    says what that was where the built-in default does otherwise."""
    saved = run_dir / "config.yaml"
    try:
        before = _flat(read_yaml(saved.read_text()))
    except (yaml.YAMLError, UnicodeDecodeError, AttributeError):
        raise NMTError(f"{saved} is damaged: cannot resume this run; choose another --run-dir") from None
    defaults = {**_flat(to_dict(Config())), **_flat(ADDED_SINCE)}
    before.update((key, defaults[key]) for key in now.keys() - before.keys() if key in defaults)
    return before


def decoding_changes(config: Config, run_dir: Path) -> str | None:
    """A line naming the decoding options of ``config`` that differ from those the resumed run
    in ``run_dir`` last saved, where any do; else None. They may change on resume, but
    validation's greedy BLEU decodes with decoding.max_len_ratio: changed, its scores are not
    comparable with the earlier validations', against which best.ckpt (under
    trainer.best_metric val_bleu), early stopping and the plateau schedule weigh them; and
    translate and evaluate take the run's decoding options from config.yaml."""
    now = _flat(to_dict(config))
    before = saved_options(run_dir, now)
    changed = [key for key in now if key.startswith("decoding.") and before.get(key) != now[key]]
    if not changed:
        return None
    line = ("decoding options differ from the run's config.yaml: "
            + ", ".join(f"{key} {before.get(key)} -> {now[key]}" for key in changed))
    if "decoding.max_len_ratio" in changed:
        line += f" ({max_len_ratio_effect(config)})"
    return line + "; translate and evaluate take the new values"


def max_len_ratio_effect(config: Config) -> str:
    """What a decoding.max_len_ratio changed at a resume does to ``config``'s run: validation's
    greedy BLEU decodes with it, so its later scores are not comparable with the earlier ones.
    That steers the run where BLEU is weighed: best.ckpt and early stopping under
    trainer.best_metric val_bleu, the learning rate under optim.schedule plateau. Otherwise
    (the configs' val_loss, a teacher-forced loss the ratio does not touch) only the logged
    val_bleu is affected: the line said "against which trainer.best_metric val_bleu chooses
    best.ckpt" to runs whose best.ckpt follows val_loss."""
    weighed = []
    if config.trainer.best_metric == "val_bleu":
        weighed.append("trainer.best_metric val_bleu chooses best.ckpt and early stopping waits")
    if config.optim.schedule == "plateau":
        weighed.append("the plateau schedule lowers the learning rate")
    said = "validation's greedy BLEU decodes with max_len_ratio: from here on "
    if weighed:
        return (said + "it is not comparable with the earlier validations', against which "
                + " and ".join(weighed))
    return (said + "the logged val_bleu is not comparable with the earlier validations'; "
            f"best.ckpt and early stopping follow {config.trainer.best_metric}, which it leaves alone")


def _same_or_chosen_precision(key: str, before: dict, now: dict) -> bool:
    """Whether ``key`` is trainer.precision, given as ``auto`` on one side or as two names of
    one precision (bf16 and bf16-mixed: ``lightning_name``): ``auto`` resumes in the precision
    the run trained in (``kept_precision``), and a precision given over it is the user's choice
    (another machine, where the kept one is slow). Two precisions given, and different, change
    the trajectory."""
    if key != "trainer.precision":
        return False
    this, that = before.get(key), now.get(key)
    return "auto" in (this, that) or lightning_name(this) == lightning_name(that)


def kept_precision(checkpoint: dict) -> PrecisionChoice | None:
    """The precision the run of ``checkpoint`` trained its last segment in, which a resumed
    run under ``trainer.precision: auto`` keeps: ``auto`` decides by what is fast on the
    machine, and deciding again at a resume (a busy machine's probe, another CPU) switched
    precision in the middle of the run. Where the segment ran on another device, the reason
    says so: ``auto`` might choose otherwise here. None for a checkpoint that does not record
    it (written before segments noted their precision)."""
    segments = [segment for segment in checkpoint.get("nmt_segments", [])
                if isinstance(segment, dict) and segment.get("precision")]
    if not segments:
        return None
    last = segments[-1]
    reason = "auto, as the run has trained so far: kept on resume"
    if last.get("device") not in (None, device_name()):
        reason += (f"; it trained on {last['device']}, and auto might choose otherwise on "
                   f"{device_name()}: give trainer.precision to choose")
    return PrecisionChoice(last["precision"], reason)


def with_model_defaults(options: dict) -> dict:
    """Flat ``options`` with the model options they leave out at their family's defaults:
    ``model.max_positions: 512`` given or left out builds the same Transformer."""
    family = MODELS.get(options.get("model.family"))
    if family is None:
        return options
    defaults = {f"model.{name}": parameter.default
                for name, parameter in inspect.signature(family).parameters.items()
                if name != "vocab_size"}
    return {**defaults, **options}


def out_of_patience(checkpoint: dict, patience: int) -> tuple[int, int] | None:
    """(update, validations waited) where the run of ``checkpoint`` (its last.ckpt) has waited
    at least ``patience`` validations (the patience given now: raising it trains on) without
    its metric improving: early stopping ended it, or waited as long as a patience lowered
    since allows. None otherwise. Re-running the command of such a run then trains nothing,
    as for a finished budget, instead of one more update and validation."""
    if patience <= 0:
        return None
    waits = [state.get("wait_count", 0) for key, state in checkpoint.get("callbacks", {}).items()
             if key.startswith("EarlyStopping") and isinstance(state, dict)]
    return (checkpoint["global_step"], max(waits)) if waits and max(waits) >= patience else None


def epochs_past(checkpoint: dict, max_epochs: int) -> int | None:
    """The epochs the run of ``checkpoint`` has ended (the one it is in, or ended at its last
    batch, not counted) where they are more than ``max_epochs`` (a budget lowered on resume),
    else None: the run has trained past its budget, as where a lowered max_steps ends it, and
    Lightning refused such a checkpoint with a traceback."""
    epochs = checkpoint.get("epoch", 0)
    return epochs if 0 < max_epochs < epochs else None


def budget_ended(run_dir: Path, checkpoint: dict, max_steps: int, max_epochs: int
                 ) -> tuple[str, str] | None:
    """The budget the run of ``checkpoint`` finished, ("--max-epochs", "2 epochs") or
    ("--trainer.max_steps", "8 updates"), where the same or less is given again: its
    train_stats.json is of that end, written at its last update (a run written before it
    counted ``steps_per_epoch`` is left to Lightning). Else None. Such a run trained nothing
    again, but logged an empty version and chose its weights anew."""
    try:
        stats = json.loads((run_dir / "train_stats.json").read_text())
    except (OSError, ValueError):  # unfinished (resuming removes it), or unreadable
        return None
    if not isinstance(stats, dict) or stats.get("steps") != checkpoint["global_step"]:
        return None
    if 0 < max_steps <= stats["steps"]:
        return "--trainer.max_steps", f"{stats['steps']:,} updates"
    per_epoch = stats.get("steps_per_epoch")  # exact, where "epochs" is rounded (2.996: 3.0)
    if type(per_epoch) is int and 0 < max_epochs and stats["steps"] >= max_epochs * per_epoch:
        return "--max-epochs", f"{stats['epochs']:g} epochs"
    return None


def time_spent(checkpoint: dict, budget: str | None) -> float | None:
    """The seconds the run of ``checkpoint`` has trained where they reach ``budget``
    (DD:HH:MM:SS, as Lightning's Timer takes it), else None: the Timer counts the training of
    every segment, validations during it included, so the same budget again trains nothing.
    Segments trained before every run kept a Timer (2026-11-27) count only where they ran
    with a budget."""
    timer = checkpoint.get("callbacks", {}).get("Timer")
    if budget is None or not isinstance(timer, dict):
        return None
    days, hours, minutes, seconds = map(int, budget.split(":"))
    spent = timer.get("time_elapsed", {}).get("train", 0.0)
    limit = datetime.timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    return spent if spent >= limit.total_seconds() else None


# What Lightning reads from a checkpoint to resume: the weights, the optimizer and schedule,
# and where the loops stood.
RESUME_KEYS = ("state_dict", "optimizer_states", "lr_schedulers", "loops")


def load_mapped(last: Path) -> dict:
    """A checkpoint, memory-mapped where it is torch's zip format, as Lightning writes it:
    then nothing is read but the index and what is looked at."""
    return torch.load(last, map_location="cpu", weights_only=False, mmap=zipfile.is_zipfile(last))


def check_loadable(last: Path) -> None:
    """A one-line error, before anything is written, where ``last`` cannot be resumed from (a
    copy cut short, a file of something else)."""
    try:
        checkpoint = load_mapped(last)
    except Exception as err:  # unpickling, a zip archive cut short, an empty file, ...
        reason = first_line(err)
        raise NMTError(f"{last} is damaged: cannot resume this run ({reason}); restore it, or "
                       "choose another --run-dir") from None
    if not isinstance(checkpoint, dict) or not all(key in checkpoint for key in RESUME_KEYS):
        raise NMTError(f"{last} is not a training checkpoint (it lacks one of "
                       f"{', '.join(RESUME_KEYS)}): cannot resume this run; restore it, or "
                       "choose another --run-dir")


def check_vocabulary(run_dir: Path, tokenizer: Tokenizer) -> None:
    """A resumed run's weights index the pieces of its own spm.model. Where the corpus was
    prepared anew (its training files changed) with other pieces, resuming would give every
    id another meaning: a one-line error instead, as where the run's spm.model is gone."""
    if not (run_dir / "spm.model").is_file():
        raise NMTError(f"{run_dir / 'spm.model'} is missing: cannot resume this run (its weights "
                       "index that model's pieces); restore it, or choose another --run-dir")
    if Tokenizer(run_dir / "spm.model").vocabulary() != tokenizer.vocabulary():
        raise NMTError(f"{run_dir} was trained with other SentencePiece pieces than the corpus "
                       "gives now (its files changed since): cannot resume this run; restore "
                       "the files, or choose another --run-dir")


TRAINING_DATA = "train_data.json"  # what a run trains on, as a resume compares it


def training_data_record(data: PreparedData) -> dict:
    """The training pairs of a prepared corpus, and its validation pairs (best.ckpt, early
    stopping and the plateau schedule compare their scores): each split's number of pairs and
    a digest of both sides' piece ids, in order: once per start, 7.5 ms for Multi30k's training
    pairs and 0.5 s per GB of ids (sha1 at 1.9 GB/s on the 2-core AMD EPYC Zen 4)."""
    return {**_pairs_record(data, "train"), "validation": _pairs_record(data, "val")}


def _pairs_record(data: PreparedData, split: str) -> dict:
    digest = hashlib.sha1()
    for lang in (data.src_lang, data.tgt_lang):
        side = load_side(data.folder, split, lang)
        digest.update(side.lengths.tobytes())
        digest.update(memoryview(side.ids))  # the mapped file, read page by page: no copy
    return {"pairs": len(side.lengths), "sha1": digest.hexdigest()}


def record_training_data(run_dir: Path, data: PreparedData, new_run: bool) -> None:
    """A run notes what it trains and validates on, for ``check_training_data``: a new run
    (over the record of an earlier start that left no checkpoint), and a run resumed from
    before the record (or its validation part) was kept, from then on (a record there was
    checked)."""
    path = run_dir / TRAINING_DATA
    if new_run or not path.is_file() or "validation" not in json.loads(path.read_text()):
        write_atomic(path, json.dumps(training_data_record(data)) + "\n")


def check_training_data(run_dir: Path, data: PreparedData) -> None:
    """A resumed run continues on the batches an uninterrupted run would have seen only over
    the training pairs it started with, and compares its validations with the earlier ones
    only on the same validation pairs. Where the files of either changed since (pairs added,
    dropped, edited or reordered, the pieces still the same), a one-line error; a run from
    before the record was kept resumes unchecked, as it did (and is checked from then on)."""
    try:
        before = json.loads((run_dir / TRAINING_DATA).read_text())
    except FileNotFoundError:
        return
    except (OSError, ValueError) as err:
        raise NMTError(f"{run_dir / TRAINING_DATA} is damaged ({first_line(err)}): restore it, or "
                       "delete it to resume without comparing the training pairs") from None
    now = training_data_record(data)
    before = before if isinstance(before, dict) else {}
    if {key: before.get(key) for key in ("pairs", "sha1")} != {key: now[key] for key in ("pairs", "sha1")}:
        raise NMTError(f"{run_dir} was trained on other training pairs than the corpus gives now "
                       f"({_count(before)} pairs then, {now['pairs']:,} now; its files changed "
                       "since): cannot resume this run; restore the files, or choose another --run-dir")
    validation = before.get("validation", now["validation"])  # none in a record kept before
    if validation != now["validation"]:
        raise NMTError(f"{run_dir} was validated on other pairs than the corpus gives now "
                       f"({_count(validation)} pairs then, {now['validation']['pairs']:,} now), "
                       "and its best checkpoint and early stopping compare scores on them: "
                       "cannot resume this run; restore the validation files, or choose "
                       "another --run-dir")


def _count(record) -> str:
    """A record's number of pairs as a message gives it; "?" where it is none (hand-edited)."""
    pairs = record.get("pairs") if isinstance(record, dict) else None
    return f"{pairs:,}" if type(pairs) is int else "?"


# What a new run writes into its directory before its first checkpoint (compare's cells:
# their train.log first): a run killed that early starts afresh over them.
STARTED_RUN = {"config.yaml", "spm.model", TRAINING_DATA, "logs", "tensorboard", "train.log"}


RUN_LOCK = ".lock"  # in the run directory; a dot file, so not one of the run's own files
# Set in every process of a multi-process run but its first, by each launcher Lightning runs
# under: its own DDP launcher, torchrun, SLURM, MPI (Open MPI, MPICH, PMIx: mpirun with
# mpi4py installed) and LSF's jsrun, whose ranks all run this same command
RANK_VARIABLES = ("LOCAL_RANK", "NODE_RANK", "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK",
                  "PMI_RANK", "PMIX_RANK", "JSM_NAMESPACE_RANK")


def first_process() -> bool:
    """Whether this is a run's first process (or its only one): every launcher sets a rank
    variable other than 0 in the others (``RANK_VARIABLES``)."""
    return all(os.environ.get(name, "0") == "0" for name in RANK_VARIABLES)


def hold(lock: IO[str], run_dir: Path) -> None:
    """Take the kernel's lock (``flock``) on the open ``lock`` file and note who holds it; a
    one-line error naming the holder where another process has it. A file system without
    locks (some network ones) is trained on unguarded."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip()
        raise NMTError(f"{run_dir} is being trained by another process"
                       f"{f' ({holder})' if holder.startswith('pid ') else ''}: let it end, or "
                       "stop it, then run this again") from None
    except OSError:
        return
    lock.truncate(0)
    lock.write(f"pid {os.getpid()} on {socket.gethostname()}\n")  # a shared file system: which host
    lock.flush()


@contextmanager
def run_lock(run_dir: Path, processes: int = 1) -> Iterator[None]:
    """Hold ``run_dir`` for one training at a time: a second ``nmt train`` into it (a run
    started twice, a compare run again while an orphaned cell trains on) is a one-line error
    naming the process at it, not two processes writing the same checkpoints. The lock goes
    with the process however that ends. Of a run Lightning trains in several ``processes``
    only the first takes it (a DDP launcher runs the same command again for the other ranks);
    processes a launcher started that Lightning sees one by one (mpirun without mpi4py; a
    sweep, ``--run-dir r$SLURM_PROCID``) each take their own, so two never train one run
    directory. A directory made here that ends holding nothing but the lock (a start that
    failed) is removed again, with the folders made for it."""
    if processes > 1 and not first_process():
        yield
        return
    made = [folder for folder in (run_dir, *run_dir.parents) if not folder.exists()]
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / RUN_LOCK
    with open(path, "a+") as lock:
        hold(lock, run_dir)
        try:
            yield
        finally:
            if made and [entry.name for entry in run_dir.iterdir()] == [RUN_LOCK]:
                path.unlink()
                remove_empty(made)


def refuse_to_overwrite(run_dir: Path) -> None:
    """A one-line error where a new run in ``run_dir`` would overwrite what is there: the
    checkpoints of a run that cannot be resumed, or files no run of ours wrote (an export,
    another tool's output)."""
    if not run_dir.is_dir():
        return
    if earlier := sorted(str(path.relative_to(run_dir)) for path in run_dir.rglob("*.ckpt")):
        raise NMTError(f"{run_dir} holds checkpoints ({', '.join(earlier)}) of a run that "
                       "cannot be resumed (that needs last.ckpt and config.yaml); choose "
                       "another --run-dir, or move them away")
    if others := sorted(path.name for path in run_dir.iterdir()
                        if path.name not in STARTED_RUN and not path.name.startswith(".")):
        raise NMTError(f"{run_dir} holds files a new run would mix with or overwrite "
                       f"({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}); choose "
                       "another --run-dir")


def forget_finished(run_dir: Path) -> None:
    """Remove a resumed run's train_stats.json: it is rewritten when the run ends again, with
    every segment's totals (kept in last.ckpt). Until then its figures are of the earlier end
    (steps, best score, the weights chosen, for which translation takes best.ckpt meanwhile),
    and ``nmt compare`` reads the file as the run finished."""
    (run_dir / "train_stats.json").unlink(missing_ok=True)


def drop_undone_metrics(run_dir: Path, step: int) -> None:
    """The rows of the earlier segments' metrics.csv (logs/version_N/) at update ``step`` (the
    resumed checkpoint's) or later. A segment stopped after its last checkpoint logged the
    updates it took since; the resumed run takes them again and logs them in its own version,
    so that the versions together held two rows for such an update (under a time budget's
    cosine, with other learning rates): learning curves drawn from them doubled back. A new
    run (``step`` 0) drops every row of the starts before it that left no checkpoint. A row's
    step is the updates taken before it (a validation's, before the next update): rows below
    ``step`` stay."""
    for path in sorted((run_dir / "logs").glob("version_*/metrics.csv")):
        try:
            rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8"))))
        except (OSError, UnicodeDecodeError, csv.Error):  # unreadable: left as it is
            continue
        if not rows or "step" not in rows[0]:  # not Lightning's CSV: left as it is
            continue
        column = rows[0].index("step")
        kept = [row for row in rows[1:] if not (len(row) > column and row[column].isdecimal()
                                                and int(row[column]) >= step)]
        if len(kept) < len(rows) - 1:
            text = io.StringIO()
            csv.writer(text).writerows([rows[0], *kept])  # \r\n, as Lightning writes
            write_atomic(path, text.getvalue())
