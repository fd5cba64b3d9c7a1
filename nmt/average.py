"""Checkpoint averaging (``nmt average``), as fairseq's ``average_checkpoints``.

The element-wise mean of the weights of a run's last N checkpoints: an average over the
end of training that usually scores better than any single one of them (Vaswani et al.
2017, section 6.1, average the last 5 or 20). The run keeps those checkpoints when trained
with ``trainer.keep_last_checkpoints=N`` (in RUN/steps/, one per validation).
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import torch

from nmt.config import existing_run_dir
from nmt.errors import NMTError, first_line
from nmt.files import refuse_export, save_atomic
from nmt.run_identity import IDENTITY_KEY, LOADED_WRONGLY, check_identity, identity_of_run
from nmt.translator import final_weights_of

STEPS_DIR = "steps"  # RUN/steps/step<global step>.ckpt, written by training


def step_checkpoints(run_dir: str | Path) -> list[Path]:
    """The checkpoints a run kept in RUN/steps/, oldest first (by global step)."""
    folder = Path(run_dir) / STEPS_DIR
    return sorted((path for path in folder.glob("step*.ckpt") if step_of(path) is not None),
                  key=step_of)


def step_of(path: Path) -> int | None:
    """The global step in a kept checkpoint's name (RUN/steps/step<global step>.ckpt)."""
    match = re.fullmatch(r"step(\d+)\.ckpt", path.name)
    return int(match.group(1)) if match else None


def final_weights(run_dir: str | Path, keep: int) -> tuple[str, str]:
    """The weights file a finished run translates with, and why: averaged.ckpt, the mean of the
    last ``keep`` checkpoints it kept (written here), when best.ckpt is older than every one of
    them, else best.ckpt (last.ckpt where no validation wrote a best.ckpt).

    best.ckpt has the lowest validation loss. Trained with label smoothing, that loss bottoms
    out early in a long run while the translations still improve, so a best.ckpt older than
    all the checkpoints kept for averaging is an early model: in 7 of 7 such runs their average
    scored higher on validation BLEU (by 0.85) and in 6 on test (by 0.63). When best.ckpt is
    among them the two tie on test, and best.ckpt stays (docs/performance.md, "Which weights").
    With early stopping's patience at least ``keep``, a run that early stopping ended always
    takes the average."""
    run_dir = Path(run_dir)
    best = run_dir / "best.ckpt"
    if not best.is_file():
        return "last.ckpt", "no validation wrote a best.ckpt"
    kept = step_checkpoints(run_dir)[-keep:] if keep > 0 else []
    if not kept:
        return "best.ckpt", "no checkpoints kept for averaging"
    first, last = step_of(kept[0]), step_of(kept[-1])
    span = (f"the one checkpoint kept (update {first:,})" if len(kept) == 1
            else f"the {len(kept)} checkpoints kept (updates {first:,}-{last:,})")
    try:  # a damaged checkpoint must not fail the finished run
        best_step = _load(best)["global_step"]
        if best_step >= first:
            return "best.ckpt", f"best.ckpt (update {best_step:,}) is not older than {span}"
        average_run(run_dir, last=keep)
    except NMTError as err:
        return "best.ckpt", f"averaging failed: {err}"
    mean = "their average" if len(kept) > 1 else "that checkpoint, as averaged.ckpt"
    return "averaged.ckpt", f"best.ckpt (update {best_step:,}) is older than {span}: {mean}"


def average_state_dicts(paths: list[Path], run_dir: Path | None = None
                        ) -> tuple[dict[str, torch.Tensor], dict | None]:
    """Element-wise mean of the ``state_dict`` of each checkpoint, accumulated in float64
    and cast back to each tensor's dtype; tensors that are not floating point (counters)
    must agree and are kept as they are. Loads one checkpoint at a time; each must have been
    trained for ``run_dir``, the run they are averaged for, where given (``check_identity``),
    and where that run cannot tell (a folder of checkpoints alone, without config.yaml), for
    the run of the first one that names its own: a mean of two runs' weights is no model.
    Returns the mean and the identity the checkpoints hold (None where none holds one: written
    before identities were kept), for the average to carry."""
    expected = None if run_dir is None else identity_of_run(run_dir)
    owner, harm = run_dir, LOADED_WRONGLY  # whose identity ``expected`` is
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    identity = None
    for path in paths:
        checkpoint = _load(path)
        check_identity(checkpoint, expected, path, owner, harm)
        if expected is None and isinstance(checkpoint.get(IDENTITY_KEY), dict):
            expected, owner = checkpoint[IDENTITY_KEY], path
            harm = "the two runs' weights cannot be averaged; average one run's checkpoints"
        identity = checkpoint.get(IDENTITY_KEY, identity)
        state = checkpoint["state_dict"]
        if total and (state.keys() != total.keys()
                      or any(value.shape != total[key].shape for key, value in state.items())):
            raise NMTError(f"{path} holds other weights than {paths[0]}: not the same model")
        for key, value in state.items():
            dtypes[key] = value.dtype
            if not value.is_floating_point():
                if key in total and not torch.equal(total[key], value):
                    raise NMTError(f"{key} differs between checkpoints and cannot be averaged")
                total[key] = value
            else:
                total[key] = total.get(key, 0) + value.double()
    mean = {key: (value / len(paths)).to(dtypes[key]) if value.is_floating_point() else value
            for key, value in total.items()}
    return mean, identity


def average_run(run_dir: str | Path, last: int | None = None,
                out: str | Path | None = None) -> tuple[Path, list[Path]]:
    """Average the last ``last`` (default: all) kept checkpoints of ``run_dir`` into ``out``
    (default RUN/averaged.ckpt), which carries their identity (``nmt.run_identity``). Returns
    the file written and the checkpoints averaged."""
    run_dir = existing_run_dir(run_dir)
    refuse_export(run_dir, "nmt average takes a training run")
    paths = step_checkpoints(run_dir)
    if not paths and not (run_dir / "config.yaml").is_file():  # a folder that is no run at all
        raise NMTError(f"no config.yaml in {run_dir}: is it a training run directory?")
    if not paths:
        raise NMTError(f"no step checkpoints in {run_dir / STEPS_DIR}: train with "
                       "trainer.keep_last_checkpoints=N to keep the last N")
    if last is not None and last < 1:
        raise NMTError(f"--last must be at least 1, got {last}")
    paths = paths[-last:] if last else paths
    out = Path(out) if out else run_dir / "averaged.ckpt"
    check_average_target(run_dir, out, paths)
    state, identity = average_state_dicts(paths, run_dir)
    averaged = {"state_dict": state, "nmt_averaged": [path.name for path in paths]}
    if identity is not None:
        averaged[IDENTITY_KEY] = identity
    save_atomic(averaged, out)  # a reader never sees half a file
    return out, paths


def _load(path: Path) -> dict:
    try:  # Lightning checkpoints hold more than tensors (hyper-parameters, loop state)
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # unpickling errors of every kind
        reason = first_line(err)
        raise NMTError(f"cannot load {path}: damaged checkpoint ({reason})") from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise NMTError(f"{path} is not a training checkpoint (no state_dict)")
    state = checkpoint["state_dict"]  # another program's may nest its parts (model, optimizer)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise NMTError(f"{path} is not a training checkpoint (its state_dict is not a "
                       "tensor per weight's name)")
    return checkpoint


def check_average_target(run_dir: Path, out: Path, paths: list[Path]) -> None:
    """Where an average of ``paths`` may go: not over the run's own files (its checkpoints,
    its config, SentencePiece model and logs; inside the run only a new .ckpt) or the average
    that training chose as its weights, unless it is the same average; inside another run
    (a folder with a config.yaml and a spm.model) only as a new .ckpt, and not as its
    averaged.ckpt (where that run's training chose its average and the file is gone, translate
    would take this one as that run's weights); elsewhere over an existing file only if it is
    a checkpoint (an earlier average, say)."""
    target, run = out.resolve(), run_dir.resolve()
    check_not_run_file(run, target, out)
    check_not_chosen_average(run, target, out, paths)
    other = next((p for p in target.parents if p != run and (p / "config.yaml").is_file()
                  and (p / "spm.model").is_file()), None)
    if other is not None:
        check_not_run_file(other, target, out)
        if target.exists():
            raise NMTError(f"--out {out} is a file of the run {other}; name a new .ckpt")
        if target == (other / "averaged.ckpt").resolve():  # where that run's would go
            raise NMTError(f"--out {out} is where the run {other} keeps its own average (which "
                           "translate may use as its weights); name another .ckpt")
    if target.is_file() and not zipfile.is_zipfile(target):  # torch.save's format; a corpus file
        raise NMTError(f"--out {out} exists and is not a checkpoint; name a new file")


def check_not_chosen_average(run: Path, target: Path, out: Path, paths: list[Path]) -> None:
    """``target`` is not the average that training chose as ``run``'s weights, unless it is
    the same average of ``paths``."""
    if target != (run / "averaged.ckpt").resolve() or final_weights_of(run) != "averaged.ckpt" \
            or not target.is_file():
        return
    chosen = _load(target).get("nmt_averaged", [])
    if chosen != [p.name for p in paths]:
        raise NMTError(f"{out} is the average of {', '.join(chosen) or 'other checkpoints'} that "
                       "training chose as the run's weights (translate uses it by default); "
                       "write this one with --out to another file")


def check_not_run_file(run: Path, target: Path, out: Path) -> None:
    """``target`` is none of ``run``'s own files (inside it only a new .ckpt may go)."""
    checkpoints = {(run / name).resolve() for name in ("best.ckpt", "last.ckpt")}  # links too
    own = target in checkpoints or target.is_relative_to((run / STEPS_DIR).resolve())
    inside = target.is_relative_to(run) and target.suffix != ".ckpt"
    if own or (inside and target.exists()):
        raise NMTError(f"--out {out} is one of the own files of the run {run}; name another .ckpt")
    if inside:  # a new file, but of a name the run's own files may take (logs, eval)
        raise NMTError(f"--out {out} is inside the run {run}, where only a new .ckpt may go; "
                       "name a .ckpt, or a file outside the run")
