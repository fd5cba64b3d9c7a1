"""A training config checked before anything runs: one-line errors for options that would
fail only after data preparation, or never (``nmt train``, ``nmt bench``, ``nmt compare``)."""

from __future__ import annotations

import datetime
import math

from nmt.config import DECODING_PRECISIONS, Config, DecodingConfig, OptimConfig
from nmt.errors import NMTError
from nmt.models import check_model_config, model_option
from nmt.schedules import SCHEDULES
from nmt.translator import decoding_options

# trainer.best_metric -> its better direction. val_loss is the cross-entropy of the references
# (no label smoothing), as fairseq and Marian select by default; val_bleu is greedy BLEU,
# noisier from one validation to the next.
BEST_METRICS = {"val_loss": "min", "val_bleu": "max"}


def max_time(value: str | None) -> str | None:
    """HH:MM:SS (or DD:HH:MM:SS) in the form Lightning's Timer takes, DD:HH:MM:SS with two
    digits a field: "1:00:00" and "0:90:00" are one hour and an hour and a half."""
    if value is None:
        return None
    parts = value.split(":")
    if len(parts) not in (3, 4) or not all(p.isdecimal() for p in parts):
        raise NMTError(f"--max-time must be HH:MM:SS, got '{value}'")
    days, hours, minutes, seconds = map(int, [0] * (4 - len(parts)) + parts)
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total == 0:
        raise NMTError(f"--max-time {value} trains nothing: give a budget above 0")
    days, rest = divmod(total, 86400)
    return f"{days:02d}:{rest // 3600:02d}:{rest // 60 % 60:02d}:{rest % 60:02d}"


def check_training_config(config: Config) -> None:
    """One-line errors for options that would fail only after data preparation, or never."""
    if config.run_dir == "":  # run_dir_of read it as unset: the default folder, silently
        raise NMTError("bad config: run_dir is empty (an unset variable?): name a folder, or "
                       "leave it out (null) for the default under checkpoints/")
    check_model_fits(config)
    check_data_config(config)
    check_optim_config(config.optim)
    check_trainer_config(config)


def check_data_config(config: Config) -> None:
    """Sizes and counts of the data pipeline, the seed, and the decoding options validation
    uses."""
    d = config.data
    for key in ("corpus", "data_dir", "hub_dataset", "src_lang", "tgt_lang"):
        if getattr(d, key) == "":  # read as unset, or as the current folder: a fallback, silently
            raise NMTError(f"bad config: data.{key} is empty (an unset variable?): give it a "
                           "value, or leave it out for the default")
    for key in ("max_len", "max_tokens", "eval_max_tokens", "vocab_size", "spm_sample"):
        if getattr(d, key) < 1:
            raise NMTError(f"data.{key} must be at least 1, got {getattr(d, key)}")
    if d.max_tokens <= d.max_len:  # a pair costs its longer side + EOS (PairDataset.lengths)
        raise NMTError(f"data.max_tokens {d.max_tokens} cannot hold one training pair of "
                       f"data.max_len {d.max_len} pieces ({d.max_len + 1} tokens with its end): "
                       f"give {d.max_len + 1} or more, or a lower data.max_len")
    if d.train_lines is not None and d.train_lines < 1:
        raise NMTError(f"data.train_lines must be at least 1 (or null: all), got {d.train_lines}")
    if d.src_lang == d.tgt_lang:
        raise NMTError(f"data.src_lang and data.tgt_lang are both '{d.src_lang}': translation "
                       "needs two languages")
    if d.num_workers < 0:
        raise NMTError(f"data.num_workers must be 0 or more, got {d.num_workers}")
    if not 0 <= config.seed < 2**32:  # numpy's seeds
        raise NMTError(f"seed must be from 0 to {2**32 - 1}, got {config.seed}")
    check_decoding_config(config.decoding)


def check_decoding_config(dec: DecodingConfig) -> None:
    """The run's decoding options, which validation uses and translate, evaluate and serve
    take by default: now, not at the first translation after training."""
    if dec.beam_size < 1:
        raise NMTError(f"decoding.beam_size must be at least 1, got {dec.beam_size}")
    try:
        decoding_options(dec, None, dec.nbest, None)
    except NMTError as err:
        raise NMTError(f"decoding: {err}") from None
    if dec.precision not in DECODING_PRECISIONS:
        raise NMTError(f"unknown decoding.precision '{dec.precision}'; choose one of: "
                       f"{', '.join(DECODING_PRECISIONS)}")


def check_model_fits(config: Config) -> None:
    """The model's options, and the data and dropout options that depend on the model."""
    cls, kwargs = check_model_config(config.model)
    max_positions = model_option(cls, kwargs, "max_positions")
    if config.data.max_len >= max_positions:
        raise NMTError(f"data.max_len {config.data.max_len} must be below the model's "
                       f"max_positions {max_positions}")
    for run in ("long_run", "short_run"):
        dropout, epochs = getattr(config.optim, f"{run}_dropout"), getattr(config.optim, f"{run}_epochs")
        if dropout is not None and not (0 <= dropout < 1 and hasattr(cls, "set_dropout")):
            raise NMTError(f"optim.{run}_dropout {dropout} needs a value in [0, 1) and a model "
                           f"with set_dropout ({cls.__name__})")
        if dropout is not None and not 0 <= epochs < math.inf:
            raise NMTError(f"optim.{run}_epochs must be 0 or more, got {epochs}")


def check_optim_config(optim: OptimConfig) -> None:
    """The schedule by name, and values the optimizer and schedules take."""
    if optim.schedule not in SCHEDULES:
        raise NMTError(f"unknown schedule '{optim.schedule}'; choose one of: {', '.join(SCHEDULES)}")
    if not 0 < optim.lr < math.inf:
        raise NMTError(f"optim.lr must be above 0, got {optim.lr}")
    if not 0 <= optim.min_lr < math.inf:
        raise NMTError(f"optim.min_lr must be 0 or more, got {optim.min_lr}")
    if optim.schedule in ("cosine", "plateau") and optim.min_lr > optim.lr:
        effect = "rise to it" if optim.schedule == "cosine" else "never lower the rate"
        raise NMTError(f"optim.min_lr {optim.min_lr} is above optim.lr {optim.lr}: the "
                       f"{optim.schedule} schedule would {effect}; give a floor below the peak")
    if not 0 <= optim.weight_decay < math.inf:
        raise NMTError(f"optim.weight_decay must be 0 or more, got {optim.weight_decay}")
    if not 0 < optim.plateau_factor < 1 or optim.plateau_patience < 0:
        raise NMTError(f"optim.plateau_factor must be in (0, 1) and optim.plateau_patience 0 or "
                       f"more, got {optim.plateau_factor} and {optim.plateau_patience}")
    if not 0 <= optim.ema_decay < 1:
        raise NMTError(f"optim.ema_decay must be in [0, 1) (0: off), got {optim.ema_decay}")
    if not 0 <= optim.label_smoothing < 1:
        raise NMTError(f"optim.label_smoothing must be in [0, 1), got {optim.label_smoothing}")
    if len(optim.betas) != 2 or not all(0 <= beta < 1 for beta in optim.betas):
        raise NMTError(f"optim.betas must be two values in [0, 1), got {list(optim.betas)}")
    least = 1 if optim.schedule == "inverse_sqrt" else 0  # it divides by the warm-up
    if optim.warmup_steps < least:
        raise NMTError(f"optim.warmup_steps must be at least {least} for schedule "
                       f"{optim.schedule}, got {optim.warmup_steps}")


# The precisions training runs in, by Lightning's names (bf16 and 16 are its short names for
# the mixed ones); its "true" half and double precisions are not among them: the loss, the
# searches and the validation sums keep fp32 tensors beside the model's.
TRAINING_PRECISIONS = ("auto", "32-true", "32", "bf16-mixed", "bf16", "16-mixed", "16")


def _validation_interval_valid(interval) -> bool:
    """A number of batches (1 or more), a fraction of an epoch in (0, 1], a time DD:HH:MM:SS
    or a dict of timedelta's arguments above 0 (Lightning validates after every batch at a
    time of 0 or less), or None (Lightning's default, once an epoch). Not a boolean:
    Lightning reads true as 1 batch."""
    if isinstance(interval, bool):
        return False
    if isinstance(interval, int):
        return interval >= 1
    if isinstance(interval, float):
        return 0 < interval <= 1
    if isinstance(interval, str):
        fields = interval.split(":")
        return len(fields) == 4 and all(f.isdecimal() for f in fields) and any(map(int, fields))
    if isinstance(interval, dict):
        try:
            return datetime.timedelta(**interval).total_seconds() > 0
        except TypeError:  # not timedelta's arguments
            return False
    return interval is None


def check_trainer_config(config: Config) -> None:
    """Budgets, validation cadence, early stopping and the metric that picks best.ckpt."""
    t = config.trainer
    max_time(t.max_time)
    if t.best_metric not in BEST_METRICS:
        raise NMTError(f"unknown trainer.best_metric '{t.best_metric}'; choose one "
                       f"of: {', '.join(BEST_METRICS)}")
    if t.early_stopping_patience < 0:
        raise NMTError(f"trainer.early_stopping_patience {t.early_stopping_patience}: "
                       "give the validations to wait, or 0 to train to the end of the budget")
    if not _validation_interval_valid(t.val_check_interval):
        raise NMTError(f"trainer.val_check_interval {t.val_check_interval}: give a number of "
                       "batches (1 or more), a fraction of an epoch in (0, 1], or a time "
                       "DD:HH:MM:SS above 0")
    if t.log_every_n_steps < 0:
        raise NMTError(f"trainer.log_every_n_steps must be 0 or more, got {t.log_every_n_steps}")
    for key in ("max_epochs", "max_steps"):
        if getattr(t, key) < -1:  # under cosine, read as no budget: "none is set"
            raise NMTError(f"trainer.{key} must be 1 or more (-1: no limit), got {getattr(t, key)}")
    if t.max_epochs == 0 or t.max_steps == 0:
        raise NMTError("trainer.max_epochs and trainer.max_steps of 0 train nothing: give a budget "
                       "(-1: no limit)")
    if t.gradient_clip_val is not None and not 0 <= t.gradient_clip_val < math.inf:
        raise NMTError(f"trainer.gradient_clip_val must be 0 (off) or more, got {t.gradient_clip_val}")
    if t.keep_last_checkpoints < 0:
        raise NMTError(f"trainer.keep_last_checkpoints must be 0 (none) or more, got "
                       f"{t.keep_last_checkpoints}")
    if t.precision not in TRAINING_PRECISIONS:  # Lightning takes more: 16-true, bf16-true, 64-true
        raise NMTError(f"trainer.precision {t.precision}: nmt trains fp32 weights, with bf16 or "
                       "fp16 matmuls at most; choose auto, 32-true, bf16-mixed or 16-mixed")
    if t.accumulate_grad_batches < 1:
        raise NMTError(f"trainer.accumulate_grad_batches must be at least 1, got "
                       f"{t.accumulate_grad_batches}")
    if config.optim.schedule == "cosine" and t.max_steps <= 0 and t.max_epochs <= 0 \
            and t.max_time is None:
        raise NMTError("schedule cosine decays to the end of the budget, and none is set "
                       f"(trainer.max_steps {t.max_steps}, trainer.max_epochs {t.max_epochs}, no "
                       "--max-time): give one, or choose another optim.schedule")
