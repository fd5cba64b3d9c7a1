"""``nmt compare``: the attention study, with one command.

A preset (``configs/compare.yaml``) names groups of cells: {family} x {scorer} x {variant}
x {seed}. Every cell is an ordinary training run of its family's config plus the preset's,
the variant's and the cell's own overrides, trained in a child process (its time and memory
are its own) into ``<runs>/<cell>-<key>``, where the key is a hash of the cell's fully
resolved configuration. The cell then leaves a small record (scores, hypotheses, attention
statistics and matrices; never weights) in ``<out>/cells/<cell>/``, a folder meant to be
committed: ``nmt.study_report`` rebuilds every table and chart from the records alone.

A cell is reused only when its record's key matches, so a changed preset, override or seed
trains a new cell; an interrupted study loses only the cells in progress. ``--jobs N`` trains N
cells at once: small models leave a GPU mostly idle (8 at a time on an H100, README).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nmt.config import ADDED_SINCE, load_config, overrides_layer, read_yaml, to_dict, typed_defaults
from nmt.errors import NMTError, stop_signals_deferred
from nmt.memory import usable_cpus
from nmt.processes import CELL_PARENT, die_with_parent


@dataclass
class GroupConfig:
    """Cells trained and tabled together: each family's scorers x variants x seeds."""

    attentions: dict[str, list[str]] = field(default_factory=dict)  # family -> scorers
    seeds: int = 1
    # variant label -> {"all" | family: [overrides]}; none given: one variant, "base", the
    # preset as it is (a default here would be merged into the variants a group names)
    variants: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    def variant_overrides(self) -> dict[str, dict[str, list[str]]]:
        return self.variants or {"base": {}}


@dataclass
class PresetConfig:
    overrides: dict[str, list[str]] = field(default_factory=dict)  # "all" | family -> [key=value]
    groups: dict[str, GroupConfig] = field(default_factory=dict)


@dataclass
class CompareConfig:
    name: str = "attention"
    families: dict[str, str] = field(default_factory=lambda: {
        "rnn": "configs/rnn_bahdanau.yaml", "transformer": "configs/transformer.yaml"})
    baselines: dict[str, str] = field(default_factory=lambda: {
        "rnn": "additive", "transformer": "scaled_dot"})
    beam: int = 5
    bootstrap_samples: int = 1000
    plot_sentences: list[int] = field(default_factory=lambda: [0, 1, 2])  # test-set lines
    presets: dict[str, PresetConfig] = field(default_factory=dict)


@dataclass(frozen=True)
class Cell:
    group: str
    family: str
    attention: str
    variant: str
    seed: int

    @property
    def name(self) -> str:
        variant = "" if self.variant == "base" else f"_{self.variant}"
        return f"{self.family}_{self.attention}{variant}_seed{self.seed}"


@stop_signals_deferred()  # as load_config: a stop is taken once the config is read
def load_compare_config(path: str | None) -> CompareConfig:
    schema = typed_defaults(CompareConfig)
    if not path:
        return OmegaConf.to_object(schema)
    try:
        layer = OmegaConf.create(read_yaml(Path(path).read_text(encoding="utf-8")) or {})
        cfg = OmegaConf.to_object(OmegaConf.merge(schema, layer))
    except FileNotFoundError:
        raise NMTError(f"compare config not found: {path}") from None
    except (yaml.YAMLError, UnicodeDecodeError, OmegaConfBaseException, TypeError) as err:
        raise NMTError(f"bad compare config {path}: {str(err).splitlines()[0]}") from None
    # now, not when the first cell has trained
    if cfg.beam < 1 or cfg.bootstrap_samples < 1 or any(i < 0 for i in cfg.plot_sentences):
        raise NMTError(f"bad compare config {path}: beam and bootstrap_samples must be at least 1 "
                       f"and plot_sentences line numbers from 0, got {cfg.beam}, "
                       f"{cfg.bootstrap_samples} and {cfg.plot_sentences}")
    return cfg


def preset_of(cfg: CompareConfig, preset: str) -> PresetConfig:
    """The named preset, after checking that its families and baselines exist."""
    from nmt.attention import check_scorer  # torch: not before a --jobs worker sets its threads

    if not cfg.presets:
        raise NMTError("the compare config defines no presets (presets: {NAME: {groups: ...}}, "
                       "as configs/compare.yaml)")
    if preset not in cfg.presets:
        raise NMTError(f"unknown preset '{preset}'; choose one of: {', '.join(cfg.presets)}")
    chosen = cfg.presets[preset]
    # Overrides are keyed "all" or by family: another key (a misspelt family) would be
    # ignored, and its cells trained without them under the variant's name
    keys = ["all", *cfg.families]
    for owner, overrides in [("its overrides", chosen.overrides),
                             *((f"group {name}'s variant {label}", variant)
                               for name, group in chosen.groups.items()
                               for label, variant in group.variants.items())]:
        if unknown := [key for key in overrides if key not in keys]:
            raise NMTError(f"preset {preset}: {owner} names '{unknown[0]}', neither all nor a "
                           f"family ({', '.join(cfg.families)}): its overrides would apply to "
                           "no cell")
    for name, group in chosen.groups.items():
        if group.seeds < 1:
            raise NMTError(f"preset {preset}: group {name} has seeds {group.seeds}: at least 1")
        for family in group.attentions:
            if family not in cfg.families or family not in cfg.baselines:
                raise NMTError(f"preset {preset}: family '{family}' needs an entry in "
                               "families and in baselines")
            try:  # a misspelt baseline matched no cell: every p-value of the family left blank
                check_scorer(cfg.baselines[family])
            except NMTError as err:
                raise NMTError(f"baselines: {family}: {err}") from None
    return chosen


def cells_of(cfg: CompareConfig, preset: str, seeds: int | None = None) -> list[Cell]:
    """Every cell of the preset, in training order: group by group as the preset lists them
    (the first, main group before those that may be cut if time runs short); seed by seed, so a study stopped
    early has each cell once before any twice; within a seed the baselines first, which tell
    early whether the budget trains good models."""
    groups = preset_of(cfg, preset).groups
    cells = [Cell(name, family, attention, variant, seed)
             for name, group in groups.items()
             for seed in range(1, (seeds or group.seeds) + 1)
             for family, attentions in group.attentions.items()
             for attention in attentions
             for variant in group.variant_overrides()]
    check_cell_names(preset, cells)
    order = list(groups)
    return sorted(cells, key=lambda c: (order.index(c.group), c.seed,
                                        c.attention != cfg.baselines[c.family]))


def check_cell_names(preset: str, cells: list[Cell]) -> None:
    """A cell's name (its record's folder) leaves out its group, so that records keep their
    folders: two groups with a variant of the same name and scorer would share one."""
    seen: dict[str, Cell] = {}
    for cell in cells:
        if (other := seen.setdefault(cell.name, cell)) is cell:
            continue
        if other.group == cell.group:
            raise NMTError(f"preset {preset}: group {cell.group} lists cell {cell.name} twice")
        raise NMTError(f"preset {preset}: groups {other.group} and {cell.group} both make cell "
                       f"{cell.name} (variant {cell.variant}): name their variants apart")


def cell_overrides(cfg: CompareConfig, preset: str, cell: Cell, extra: list[str]) -> list[str]:
    """preset (all, family) <- variant (all, family) <- command line <- scorer and seed."""
    chosen = cfg.presets[preset]
    variant = chosen.groups[cell.group].variant_overrides()[cell.variant]
    overrides = [*chosen.overrides.get("all", []), *chosen.overrides.get(cell.family, []),
                 *variant.get("all", []), *variant.get(cell.family, []), *extra]
    if any(item.partition("=")[0].strip() == "run_dir" for item in overrides):
        # every cell would train into that one folder, over the others
        raise NMTError("run_dir is each cell's own, <runs>/<cell>-<key>: name the folder that "
                       "holds them with --runs")
    return [*overrides, f"model.attention={cell.attention}", f"seed={cell.seed}"]


# Options that cannot change a cell's record: naming and display, how the corpus is read (the
# same pairs either way), and the decoding precision (``finish_cell`` decodes every cell in
# fp32, so records compare across machines). Keeping them out of the key keeps recorded cells
# valid when such an option is added.
NOT_IN_KEY = {"": ("name", "run_dir"), "trainer": ("enable_progress_bar", "tensorboard"),
              "data": ("hub_streaming",), "decoding": ("precision",)}


def counts_in_key(option: str) -> bool:
    """Whether a ``key=value`` option can change a cell's record (is not one of NOT_IN_KEY)."""
    section, _, key = option.partition("=")[0].strip().rpartition(".")
    return key not in NOT_IN_KEY.get(section, ())


def cell_key(config_file: str, overrides: list[str]) -> tuple[str, dict]:
    """A 12-hex hash of the fully resolved configuration, and that configuration; a one-line
    error for options training would refuse (also where no cell is trained: --tables-only)."""
    from nmt.config_checks import check_training_config  # torch: only once cells are keyed

    config = load_config(config_file, overrides)
    check_training_config(config)
    resolved = to_dict(config)
    for section, keys in NOT_IN_KEY.items():
        for key in keys:
            (resolved[section] if section else resolved).pop(key, None)
    # An option added after cells were recorded is left out of the key at the value that does
    # what those cells did (ADDED_SINCE), so the recorded cells stay valid (the study preset
    # pins it there).
    for section, options in ADDED_SINCE.items():
        for key, old_value in options.items():
            if resolved[section].get(key) == old_value:
                resolved[section].pop(key, None)
    text = json.dumps(resolved, sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:12], resolved


def scored_as_asked(record: dict, cfg: CompareConfig) -> bool:
    """Whether a cell's record was scored at the beam ``cfg`` asks now. The key covers
    training alone: a record of another beam is decoded anew from its run (which the key still
    names), and left out of the tables until then."""
    return record["scores"].get("beam") == cfg.beam


def pictured_as_asked(record: dict, cfg: CompareConfig) -> bool:
    """Whether a cell's record holds the pictures of the plot_sentences ``cfg`` asks now (its
    scores do not depend on them: the tables keep it; a study decodes it anew where its run
    is here, and keeps it where not: training it again would replace its scores)."""
    lines = [i for i in cfg.plot_sentences if i < record["scores"]["sentences"]]
    return [picture.get("line") for picture in record["pictures"]] == lines


def train_cell(cell: Cell, config_file: str, overrides: list[str], run_dir: Path) -> None:
    """Train one cell in a child process, unless its run directory holds the finished run."""
    if (run_dir / "train_stats.json").is_file():
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "nmt", "train", "--config", config_file,
               "--run-dir", str(run_dir), *overrides, "trainer.enable_progress_bar=false"]
    print(f"  {cell.name}: training (log: {run_dir / 'train.log'})", flush=True)
    # the training ends with this process (CELL_PARENT): stopped by SIGTERM, this one ends at
    # once (its default action) and would leave it training on alone, holding its run's lock
    env = {**os.environ, CELL_PARENT: str(os.getpid())}
    with open(run_dir / "train.log", "a") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    if done.returncode != 0:
        raise NMTError(f"training {cell.name} failed; see {run_dir / 'train.log'}")


def record_cell(cfg: CompareConfig, preset: str, cell: Cell, config_file: str,
                overrides: list[str], key: str, resolved: dict, run_dir: Path,
                record_dir: Path, trial: list[str]) -> str:
    """Train one cell (unless its run is finished) and write its record, which names the
    options of a ``trial`` (``trial_options``); returns the cell's name."""
    from nmt.study_cell import finish_cell

    train_cell(cell, config_file, overrides, run_dir)
    print(f"  {cell.name}: decoding and recording", flush=True)
    finish_cell(cfg, preset, cell, key, resolved, run_dir, record_dir, trial)
    return cell.name


def _start_worker(threads: int, parent: int) -> None:
    """A worker's CPU share, set before it imports torch; its training children inherit it.
    The worker gets SIGTERM when ``nmt compare`` (pid ``parent``) ends, which ends the
    training it runs (``_in_worker``): stopped by SIGTERM, compare ended alone and its workers
    trained and recorded on."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    die_with_parent(parent, signal.SIGTERM)


class _WorkerEnded(BaseException):
    """SIGTERM in a worker's job: the pool broke (another worker died) and ends the others."""


def _end_worker(signum: int, frame) -> None:
    raise _WorkerEnded


def _in_worker(fn, *args):
    """``fn(*args)`` in a pool worker, where the pool's SIGTERM ends a training it started
    too: ``subprocess.run`` kills its child on the way out. The worker alone died and left
    the training going on, holding its run's lock, so the same command again could not train
    that cell."""
    signal.signal(signal.SIGTERM, _end_worker)
    try:
        return fn(*args)
    except _WorkerEnded:
        os._exit(128 + signal.SIGTERM)  # as SIGTERM would have: the pool waits for nothing
    finally:  # between jobs a SIGTERM ends the worker as before, without a traceback
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def threads_per_worker(workers: int) -> int:
    """An equal share of the CPUs this process may run on (``usable_cpus``), at least one: more
    threads than CPUs slow every worker down."""
    return max(1, usable_cpus() // workers)


def record_in_parallel(jobs: list[tuple], workers: int) -> None:
    """``record_cell(*job)`` for every job, ``workers`` cells at a time, each in its own process
    with an equal share of the CPU threads (e.g. several small cells sharing one GPU). A cell
    that fails does not stop the others; the failures are reported at the end. A worker
    process that dies (killed, or out of memory) ends the pool: the cells it had not recorded
    yet, running or waiting, are named as such, not as failed."""
    threads = threads_per_worker(workers)
    failed, lost = [], []
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_start_worker, initargs=(threads, os.getpid())) as pool:
        running = {pool.submit(_in_worker, record_cell, *job): job[2].name for job in jobs}
        for done in as_completed(running):
            try:
                print(f"  {done.result()}: recorded", flush=True)
            except BrokenProcessPool:  # before RuntimeError, its base: not this cell's failure
                lost.append(running[done])
            except (NMTError, OSError, RuntimeError) as err:
                failed.append(running[done])
                print(f"  {running[done]}: failed: {err}", flush=True)
    problems = [f"{len(failed)} cells failed: {', '.join(failed)}"] if failed else []
    if lost:
        problems.append(f"a worker process died (killed, or out of memory?), so {len(lost)} "
                        f"cells running or waiting were not recorded: {', '.join(lost)}; run "
                        "the same command again to record them")
    if problems:
        raise NMTError("; ".join(problems))


def trial_options(cfg: CompareConfig, preset: str, cell: Cell, key: str,
                  extra: list[str]) -> list[str]:
    """The command line's options ``extra`` where they make the cell (of ``key``) another than
    the preset's own, a trial; none where they change nothing (e.g. the preset's own epochs).
    Of a trial, the options that cannot change a cell (NOT_IN_KEY: a progress bar) are not
    part: a trial's record is the same trial's without them."""
    if not extra:  # the preset's own: no second resolution of its configuration
        return []
    return [] if key == preset_key(cfg, preset, cell) else list(filter(counts_in_key, extra))


def preset_key(cfg: CompareConfig, preset: str, cell: Cell) -> str:
    """The key of the preset's own cell: without options on the command line."""
    return cell_key(cfg.families[cell.family], cell_overrides(cfg, preset, cell, []))[0]


def same_options(these: list[str], those: list[str]) -> bool:
    """Whether two lists of ``key=value`` options set the same values: in another order, or one
    layered over another to the same end (``seed=3 seed=4`` is ``seed=4``), those that cannot
    change a cell (NOT_IN_KEY, as a record made before trials left them out may hold) aside."""
    return OmegaConf.to_container(overrides_layer(list(filter(counts_in_key, these)))) == \
        OmegaConf.to_container(overrides_layer(list(filter(counts_in_key, those))))


def check_replaceable(cfg: CompareConfig, preset: str, cell: Cell, record: dict,
                      record_dir: Path, trial: list[str]) -> None:
    """A record of other options is replaced where the preset changed (what a study's
    records follow), not by another preset's cell of the same name, nor by a trial's (options
    on the command line, ``trial``, that make other cells than the preset's own) other than the
    record's, nor by the preset's own over a trial's. A one-line error there, before anything
    trains."""
    if record.get("preset", preset) != preset:
        raise NMTError(f"{record_dir} holds preset {record['preset']}'s record of this cell, "
                       f"which preset {preset} would replace: give each preset its own --out")
    if "trial" in record:
        recorded = record["trial"]
    elif record["key"] == preset_key(cfg, preset, cell):
        recorded = []  # a record from before records named their trial: the preset's own
    else:
        recorded = trial  # ... or of options unknown: replaced, as then
    if not same_options(recorded, trial):
        made, now = (" ".join(options) or "the preset's options alone" for options in (recorded, trial))
        raise NMTError(f"{record_dir} holds a record of this cell made with {made}, which this "
                       f"run with {now} would replace: give another --out for a trial")


def planned_jobs(cfg: CompareConfig, preset: str, out: Path, runs: Path, extra: list[str],
                 seeds: int | None, train: bool) -> tuple[list[tuple], list[str]]:
    """The cells to train (if ``train``) or decode (where their run exists), as
    ``record_cell``'s arguments, and a line on each cell; a one-line error where one would
    replace a record it must not (``check_replaceable``)."""
    from nmt.study_cell import read_record

    jobs, lines = [], []
    for cell in cells_of(cfg, preset, seeds):
        config_file, overrides = cfg.families[cell.family], cell_overrides(cfg, preset, cell, extra)
        key, resolved = cell_key(config_file, overrides)
        record_dir = out / "cells" / cell.name
        record = read_record(record_dir)
        run_dir = runs / f"{cell.name}-{key}"
        trained = (run_dir / "train_stats.json").is_file()
        if record is not None and record["key"] == key and scored_as_asked(record, cfg):
            if pictured_as_asked(record, cfg):
                lines.append(f"{cell.name}: recorded already, reused")
                continue
            if not trained:  # training it again for its pictures would replace its scores too
                lines.append(f"{cell.name}: recorded already, reused, with its pictures of other "
                             f"test lines: its run, which would draw them, is not in {runs}")
                continue
        if not (train or trained):
            continue
        trial = trial_options(cfg, preset, cell, key, extra)
        if record is not None and record["key"] != key:
            check_replaceable(cfg, preset, cell, record, record_dir, trial)
            lines.append(f"{cell.name}: its record is of other options (key {record['key']}): "
                         "replaced")
        jobs.append((cfg, preset, cell, config_file, overrides, key, resolved, run_dir,
                     record_dir, trial))
    return jobs, lines


def run_compare(cfg: CompareConfig, preset: str, out: Path, runs: Path, extra: list[str],
                seeds: int | None = None, train: bool = True, workers: int = 1,
                cost: bool = False) -> list[dict]:
    """Train (if ``train``) and record every cell missing from ``out``, ``workers`` cells at a
    time; rebuild the tables. Without ``train``, only cells already recorded (or trained) are
    tabled. ``cost``: first bench each scorer's training cost (``study_cost.measure_cost``),
    once the plan has refused what it must (minutes of benches would come first otherwise)."""
    from nmt.study_report import write_report

    print(f"{len(cells_of(cfg, preset, seeds))} cells, preset {preset}, records in {out}, "
          f"runs in {runs}", flush=True)
    jobs, lines = planned_jobs(cfg, preset, out, runs, extra, seeds, train)
    for line in lines:
        print(f"  {line}", flush=True)
    if cost:
        from nmt.study_cost import measure_cost  # it imports this module

        measure_cost(cfg, preset, out, extra=extra)
    if workers > 1 and len(jobs) > 1:
        record_in_parallel(jobs, workers)
    else:
        for job in jobs:
            record_cell(*job)
    return write_report(cfg, preset, out, extra, seeds)
