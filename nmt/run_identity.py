"""What a checkpoint's weights were trained for, kept in the checkpoint itself.

Weights of the same shapes load into any run's model whatever run wrote them: a best.ckpt of
a de->en run copied into an en->de run's folder (the same corpus: the same pieces), one of a
run with another scorer that has no weights of its own (dot vs scaled_dot), or one over
another SentencePiece model of the same size would translate silently wrong (into the source
language, with a scorer it was not trained with, its piece ids read as other pieces). So
training writes the run's identity into every checkpoint (``IDENTITY_KEY``), ``nmt average``
carries it into its average, and what loads a checkpoint into a run (translate, evaluate,
serve, export, average, resume) refuses one whose identity is not the run's; checkpoints
averaged in a folder that cannot tell its run (no config.yaml) must name one run.

A checkpoint written before the identity was kept has none and loads unchecked, as before;
one written before it kept the model's options (``model``) is checked without them.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from pathlib import Path
from typing import Any

from nmt.config import Config, run_config
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NMTError
from nmt.models import check_model_config, scorer_of
from nmt.models.base import model_option

# In a checkpoint: {"pair", "family", "attention", "pieces", "model"}
IDENTITY_KEY = "nmt_identity"


def run_identity(config: Config, tokenizer: Tokenizer) -> dict[str, Any]:
    """The identity of a run of ``config`` over ``tokenizer``: its language pair, model family,
    attention scorer (the family's default where the config leaves it out), a digest of
    its SentencePiece vocabulary (``Tokenizer.vocabulary``: each id's piece and score, not the
    file's bytes, which differ between models trained on the same text on two machines), and
    the ``model_options`` its weights compute with."""
    pieces = json.dumps(tokenizer.vocabulary(), ensure_ascii=False)
    return {"pair": f"{config.data.src_lang}->{config.data.tgt_lang}",
            "family": str(config.model.get("family")),
            "attention": str(scorer_of(config.model)),
            "pieces": hashlib.sha1(pieces.encode()).hexdigest(),
            "model": model_options(config.model)}


# Options that leave what the weights compute unchanged: the longest input or output
# (max_positions; the sinusoid table is recomputed, its rows the same at any length), and
# those that act in training alone (dropout, initialisation: matched by name below)
LOAD_ANYWHERE = {"vocab_size", "max_positions"}


def model_options(model_cfg: dict[str, Any]) -> dict[str, Any]:
    """What a model's weights compute with: every option of its family's constructor, its
    default where the config leaves it out, but those of ``LOAD_ANYWHERE`` and those that
    act in training alone (dropout, initialisation). Weights of a Transformer trained with 4
    heads load into one of 2 (the same shapes) and translate wrongly there."""
    cls, kwargs = check_model_config(model_cfg)
    return {name: model_option(cls, kwargs, name) for name in inspect.signature(cls).parameters
            if name not in LOAD_ANYWHERE and "dropout" not in name and not name.endswith("_init")}


def options_differ(theirs: Any, ours: Any) -> str:
    """The options two ``model_options`` differ in, as "heads 4, not 2"; "" where none does.
    Only the options both name: one added to a family since a checkpoint was written is
    absent from it, and its default is what that checkpoint trained with."""
    if not (isinstance(theirs, dict) and isinstance(ours, dict)):
        return ""  # an identity from before the options were kept, or damaged: nothing to read
    return "; ".join(f"{name} {theirs[name]}, not {ours[name]}"
                     for name in sorted(theirs.keys() & ours.keys()) if theirs[name] != ours[name])


def identity_of_run(run_dir: Path) -> dict[str, Any] | None:
    """``run_identity`` of the training run in ``run_dir``; None where it has no config.yaml
    or spm.model to tell it (a folder of checkpoints alone)."""
    if not ((run_dir / "config.yaml").is_file() and (run_dir / "spm.model").is_file()):
        return None
    return run_identity(run_config(run_dir), Tokenizer(run_dir / "spm.model"))


LOADED_WRONGLY = "its weights would translate wrongly there; use it with the run that trained it"


def check_identity(checkpoint: dict, expected: dict[str, Any] | None, path: Path,
                   run_dir: Path | None, harm: str = LOADED_WRONGLY) -> None:
    """A one-line error where ``checkpoint`` (read from ``path``) holds an identity other than
    ``expected``, the identity of the run ``run_dir`` it is loaded into (or of the checkpoint
    it is averaged with), ending with ``harm``, what would go wrong. Nothing to check where
    either is unknown: a checkpoint from before identities were kept, a folder that is no run."""
    theirs = checkpoint.get(IDENTITY_KEY) if isinstance(checkpoint, dict) else None
    if expected is None or not isinstance(theirs, dict):
        return
    if why := identity_difference(theirs, expected, run_dir):
        raise NMTError(f"{path} is a checkpoint of another run, {why}: {harm}")


def identity_difference(theirs: dict[str, Any], expected: dict[str, Any],
                        run_dir: Path | None) -> str | None:
    """How identity ``theirs`` differs from ``expected``, the identity of ``run_dir``, the
    plainest difference first ("trained de->en, not en->de as RUN"); None where it does not.
    A key one of them lacks (kept since the other was written) is no difference."""
    differs = {
        "pair": f"trained {theirs.get('pair')}, not {expected.get('pair')} as {run_dir}",
        "family": f"a {theirs.get('family')} model, not {expected.get('family')} as {run_dir}",
        "attention": f"with {theirs.get('attention')} attention, not {expected.get('attention')} "
                     f"as {run_dir}",
        "pieces": f"over another SentencePiece model's pieces than {run_dir}'s",
    }
    for key, why in differs.items():
        if key in theirs and key in expected and theirs[key] != expected[key]:
            return why
    if options := options_differ(theirs.get("model"), expected.get("model")):
        return f"with other model options than {run_dir} ({options})"
    return None
