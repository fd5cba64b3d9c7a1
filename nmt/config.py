"""Typed run configuration: YAML files merged with command-line overrides.

A config is a tree of dataclasses (below). OmegaConf merges the defaults, a YAML
file and dotted overrides (``trainer.devices=2``), and rejects misspelled keys and
values of the wrong type. The ``model`` section is free-form here because its keys
depend on the family; the family's constructor checks them (see ``nmt.models``).
"""

from __future__ import annotations

import copy
import functools
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nmt.errors import NMTError, first_line, stop_signals_deferred
from nmt.files import write_atomic


@dataclass
class DataConfig:
    corpus: str = "multi30k"  # local folder data_dir/<corpus>, else a Hub dataset
    data_dir: str = "data"
    hub_dataset: str | None = None  # e.g. "wmt14"; multi30k defaults to bentrevett/multi30k
    hub_config: str | None = None  # e.g. "de-en" for wmt14
    hub_streaming: bool = False  # stream the Hub dataset (read twice) instead of downloading it
    train_files: list[str] | None = None  # [source file, target file]: plain text, one per line
    val_files: list[str] | None = None
    test_files: list[str] | None = None
    src_lang: str = "de"
    tgt_lang: str = "en"
    train_lines: int | None = None  # train on the first N lines only
    vocab_size: int = 8000  # joint SentencePiece vocabulary
    spm_sample: int = 200_000  # SentencePiece trains on a random sample of this many pairs
    max_len: int = 100  # training pairs longer than this (pieces, either side) are dropped
    max_tokens: int = 4096  # training batch budget: pairs x (longer side + 1), padded
    eval_max_tokens: int = 8000  # token budget of a decoding batch
    num_workers: int = 0  # loader processes building training batches (0: in the training process)


@dataclass
class OptimConfig:
    lr: float = 5e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    schedule: str = "inverse_sqrt"  # see nmt.schedules.SCHEDULERS
    warmup_steps: int = 1000  # inverse_sqrt and cosine
    plateau_factor: float = 0.5  # plateau: lr *= factor when validation BLEU stalls
    plateau_patience: int = 1
    min_lr: float = 1e-6  # plateau's lower bound; cosine's floor at the end of the budget
    ema_decay: float = 0.0  # > 0: evaluate and save an EMA of the weights (nmt.callbacks.WeightEMA)
    # A run whose budget buys at least long_run_epochs epochs trains with model.dropout for one
    # epoch, then with long_run_dropout; one whose budget buys fewer than short_run_epochs, then
    # with short_run_dropout (nmt.callbacks.DropoutForBudget); null: model.dropout only
    long_run_dropout: float | None = None
    long_run_epochs: float = 12.0
    short_run_dropout: float | None = None
    short_run_epochs: float = 3.5


@dataclass
class TrainerConfig:
    """Options handed to ``lightning.Trainer`` (plus early stopping)."""

    max_epochs: int = 30
    max_steps: int = -1
    max_time: str | None = None  # HH:MM:SS or DD:HH:MM:SS
    accelerator: str = "auto"
    devices: Any = "auto"
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "auto"  # bf16-mixed where the hardware has bf16 matmuls, else 32-true
    gradient_clip_val: float = 1.0
    accumulate_grad_batches: int = 1
    val_check_interval: Any = 1.0  # 1.0: validate and checkpoint once per epoch; N: every N batches
    log_every_n_steps: int = 50
    # The validation metric that picks best.ckpt and stops early (nmt.config_checks.BEST_METRICS):
    # val_loss, or val_bleu (greedy; it picked checkpoints before the end of a cosine schedule
    # that decoded worse with beam search, docs/performance.md)
    best_metric: str = "val_loss"
    # Stop after this many validations (not epochs) without a better best_metric; 0: never
    early_stopping_patience: int = 5
    enable_progress_bar: bool = True
    tensorboard: bool = False  # also log to RUN/tensorboard/ (pip install -e ".[tensorboard]")
    keep_last_checkpoints: int = 0  # > 0: keep the last N validation checkpoints for nmt average


DECODING_PRECISIONS = ("auto", "32-true", "bf16-mixed", "16-mixed")


@dataclass
class DecodingConfig:
    beam_size: int = 5
    alpha: float = 0.6  # GNMT length penalty exponent: 0 (none) to 10 (search.MAX_ALPHA)
    max_len_ratio: float = 1.5  # output may be up to ratio * source length + 5 pieces
    nbest: int = 1
    # Beam search drops a hypothesis more than this many nats below its sentence's best live
    # one (1-best only): 18-21% fewer decoder rows, test BLEU within 0.05 (docs/performance.md); null: all K
    prune_margin: float | None = 3.0
    # auto: bf16 (fp16 on a GPU without native bf16) where measured faster on the decoding
    # device, CPU or GPU, else fp32; or 32-true, bf16-mixed, 16-mixed
    precision: str = "auto"


@dataclass
class Config:
    name: str = "run"
    seed: int = 1
    run_dir: str | None = None  # default: see run_dir_of
    data: DataConfig = field(default_factory=DataConfig)
    model: dict[str, Any] = field(default_factory=lambda: {"family": "transformer"})
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)


class ConfigLoader(yaml.SafeLoader):
    """YAML as a config means it: true and false are booleans, yes, no, on and off are words
    (YAML 1.2; YAML 1.1 made ``src_lang: no``, Norwegian, the language "False"). A boolean
    option still takes them: OmegaConf reads yes, no, on and off into one."""


_BOOL = "tag:yaml.org,2002:bool"
ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
ConfigLoader.add_implicit_resolver(_BOOL, re.compile("^(?:true|True|TRUE|false|False|FALSE)$"),
                                   list("tTfF"))
# YAML 1.1's base-60 numbers (1:30:00 is the int 5400) are text, as in YAML 1.2: a time such as
# trainer.max_time stays one. Resolvers are tried in order, so this one goes first.
_SEXAGESIMAL = r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?"
for _first in "-+0123456789":
    ConfigLoader.yaml_implicit_resolvers[_first].insert(
        0, ("tag:yaml.org,2002:str", re.compile(f"^{_SEXAGESIMAL}$")))
# What YAML 1.1 reads as booleans or base-60 numbers, quoted in an override (OmegaConf parses
# those in 1.1)
_YAML11_TEXT = re.compile(f"yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF|{_SEXAGESIMAL}")
# What they still mean in the free-form model section, whose options are flags, sizes and
# names (a typed boolean option takes them through OmegaConf): saved as true and false, as
# runs saved them before the words were kept
_MODEL_FLAGS = {"yes": True, "on": True, "no": False, "off": False}


def read_yaml(text: str) -> Any:
    """A config file's content (``ConfigLoader``'s YAML)."""
    return yaml.load(text, Loader=ConfigLoader)


def _words_kept(item: str) -> str:
    """``key=no`` as ``key='no'``, ``key=1:30:00`` as ``key='1:30:00'``: text, as in a config file."""
    key, equals, value = item.partition("=")
    return f"{key}='{value}'" if equals and _YAML11_TEXT.fullmatch(value) else item


@functools.cache
def typed_defaults(kind: type) -> DictConfig:
    """A config dataclass' defaults and types as OmegaConf's schema, built once and read-only
    (``OmegaConf.merge`` copies its first config). Built anew for each config, it was half of
    load_config's time, and nmt compare loads a config for each of hundreds of cells."""
    schema = OmegaConf.structured(kind)
    OmegaConf.set_readonly(schema, True)
    return schema


# A stop (Ctrl-C, SIGTERM) arriving while a config is read is taken once it is read: raised
# inside OmegaConf, it left a node half-built, which failed as a ConfigKeyError traceback.
@stop_signals_deferred()
def load_config(path: str | Path | None = None, overrides: list[str] | tuple = ()) -> Config:
    """Defaults <- YAML file <- ``key.sub=value`` overrides, type-checked; returns a ``Config``.

    Raises ``NMTError`` naming the offending key for unknown keys or wrong types.
    """
    text = None
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise NMTError(f"config file not found: {path}")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise NMTError(f"{path} is not valid YAML: {err}".splitlines()[0]) from None
    # An interpolation may read the environment (${oc.env:HOME}): such a config is resolved
    # anew; any other is remembered, and copied, as the caller may change it.
    fresh = any("${" in layer for layer in (text or "", *overrides))
    resolve = _resolved.__wrapped__ if fresh else _resolved
    config = copy.deepcopy(resolve(None if path is None else str(path), text, tuple(overrides)))
    expand_home(config)
    return config


@functools.lru_cache(maxsize=256)
def _resolved(path: str | None, text: str | None, overrides: tuple[str, ...]) -> Config:
    """The config of a file's ``text`` and ``overrides`` (see ``load_config``), before ``~`` is
    expanded. Remembered: without interpolations it depends on its arguments alone, and a study
    resolves each cell's config several times (keying, references, test sets), 40-65 ms each
    on a slow CPU."""
    layers = []
    if text is not None:
        try:
            tree = read_yaml(text) or {}
        except yaml.YAMLError as err:
            raise NMTError(f"{path} is not valid YAML: {err}".splitlines()[0]) from None
        if not isinstance(tree, dict):
            raise NMTError(f"{path} must hold sections of options (a mapping), not a "
                           f"{type(tree).__name__}")
        layers.append(OmegaConf.create(tree))
    try:
        layers.append(overrides_layer(list(overrides)))
        merged = OmegaConf.merge(typed_defaults(Config), *layers)  # a copy of the first
        config = OmegaConf.to_object(merged)
    except (OmegaConfBaseException, TypeError) as err:
        raise NMTError(f"bad config: {config_error(err)}") from None
    config.model = {key: _MODEL_FLAGS.get(value.lower(), value) if isinstance(value, str) else value
                    for key, value in config.model.items()}
    return config


def expand_home(config: Config) -> None:
    """``~`` (or ``~user``) at the start of the config's paths as the shell would expand it: a
    YAML file, or a bracketed override (``data.train_files=[~/c/train.de,~/c/train.en]``, where
    the shell expands nothing), that named ~/c/train.de looked for ./~/c/train.de, and
    ``data_dir: ~/data`` prepared the corpus into a folder named ``~`` in the current one."""
    d = config.data
    for key in ("train_files", "val_files", "test_files"):
        if getattr(d, key):
            setattr(d, key, [os.path.expanduser(path) for path in getattr(d, key)])
    d.data_dir = os.path.expanduser(d.data_dir)
    if d.hub_dataset and d.hub_dataset.startswith("~"):  # a local folder; never a Hub name
        d.hub_dataset = os.path.expanduser(d.hub_dataset)
    if config.run_dir:
        config.run_dir = os.path.expanduser(config.run_dir)


def absolute_file_paths(config: Config) -> None:
    """The corpus files a command names, the folder of local corpora and a Hub dataset read
    from a local folder, as absolute paths: the run's config.yaml keeps them, and evaluate,
    run from another folder, read other files of the same names there (another
    data/multi30k: the wrong test set, under the right name), or the Hub for ./folder."""
    d = config.data
    for key in ("train_files", "val_files", "test_files"):
        if getattr(d, key):
            setattr(d, key, [str(Path(path).absolute()) for path in getattr(d, key)])
    d.data_dir = str(Path(d.data_dir).absolute())
    if d.hub_dataset and Path(d.hub_dataset).is_dir():  # a local folder in the Hub's layout
        d.hub_dataset = str(Path(d.hub_dataset).absolute())


def overrides_layer(overrides: list[str]) -> DictConfig:
    """The ``key=value`` overrides as one config layer, in order (``optim.betas=[0.8,0.9]
    optim.betas.1=0.95`` edits the list just given); a value YAML cannot read (``[0.9``) is a
    one-line error naming its override."""
    overrides = [_words_kept(item) for item in overrides]
    try:
        return OmegaConf.from_dotlist(overrides)
    except yaml.YAMLError:
        for item in overrides:
            try:
                OmegaConf.from_dotlist([item])
            except yaml.YAMLError as err:
                problem = getattr(err, "problem", None) or first_line(err)
                raise NMTError(f"bad config: {item}: the value is not YAML ({problem})") from None
        raise
    except ValueError as err:  # optim.betas=[0.9,0.98] optim.betas.a=1: OmegaConf's int('a')
        raise NMTError(f"bad config: a list's item named by other than its number ({first_line(err)}); "
                       "number it from 0, e.g. optim.betas.1=0.95") from None


def config_error(err: OmegaConfBaseException | TypeError) -> str:
    """OmegaConf's first line, with the key it is about, and its jargon for a list put plainly."""
    first, key = str(err).splitlines()[0], getattr(err, "full_key", None)
    # A list and a mapping merged (optim.betas.0=0.8): a TypeError from OmegaConf 2.4, a
    # ConfigTypeError (a TypeError too) from 2.3, in other words
    if isinstance(err, TypeError):
        return (f"{first}: a list option given by its items? give the whole list, "
                "e.g. optim.betas=[0.9,0.98]")
    if key and "is not a ListConfig" in first:
        return f"{key} takes a list: {key}=[a,b] on the command line, [a, b] in YAML"
    return f"{key}: {first}" if key and key not in first else first


# Options added after runs were trained whose built-in default differs from what those runs
# did, and the value that does what they did: a resumed run's saved config.yaml and a
# study's recorded cells lack them and mean that value (nmt.resume, nmt.compare).
ADDED_SINCE = {"decoding": {"prune_margin": None}, "trainer": {"best_metric": "val_bleu"},
               "model": {"embed_init": "unit"},
               "optim": {"long_run_dropout": None, "long_run_epochs": 12.0,
                         "short_run_dropout": None, "short_run_epochs": 3.5}}


def to_dict(config: Config) -> dict:
    """The config as plain nested dicts and lists, ready for YAML and for a study cell's key.
    Its values are those ``load_config`` typed, so code that sets one keeps the field's type
    (a float for a float, a list, not a tuple): read through OmegaConf again, which would
    convert them, it took 80 times as long."""
    return asdict(config)


def save_config(config: Config, path: str | Path) -> None:
    """Write the resolved config as YAML, atomically (temporary file, then rename)."""
    write_atomic(path, yaml.safe_dump(to_dict(config), sort_keys=False))


def run_dir_of(config: Config) -> Path:
    """``run_dir``, else checkpoints/<name>_<attention>_<src>-<tgt>."""
    if config.run_dir:
        return Path(config.run_dir)
    attention = config.model.get("attention", "default")
    return Path(f"checkpoints/{config.name}_{attention}_{config.data.src_lang}-{config.data.tgt_lang}")


def run_config(path: str | Path) -> Config:
    """The config.yaml of a training run's directory (``existing_run_dir``); a one-line error
    naming a folder without one as not a run."""
    config_file = existing_run_dir(path) / "config.yaml"
    if not config_file.is_file():
        raise NMTError(f"no config.yaml in {path}: is it a training run directory?")
    return load_config(config_file)


def refuse_checkpoint_file(path: str | Path) -> None:
    """A one-line error where ``--checkpoint`` names a file (RUN/best.ckpt, say), naming the run
    directory to give instead and the file as --weights (of translate, evaluate, serve and
    export: the hint left out export, and serve said the file was "not a training run
    directory")."""
    path = Path(path)
    if path.is_file():
        raise NMTError(f"{path} is a file: --checkpoint takes the run directory ({path.parent}); "
                       f"translate, evaluate, serve and export take a checkpoint file in it with "
                       f"--weights ({path.name})")


def existing_run_dir(path: str | Path) -> Path:
    """``path`` as a training run's directory (what ``--checkpoint`` names); a one-line error
    where there is none, and one that says so where it is a checkpoint file."""
    run_dir = Path(path)
    refuse_checkpoint_file(run_dir)
    if not run_dir.is_dir():
        raise NMTError(f"checkpoint directory not found: {run_dir}")
    return run_dir
