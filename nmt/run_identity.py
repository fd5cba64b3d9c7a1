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

A checkpoint written before the identity was kept has none and loads unchecked, as before.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from nmt.config import Config, run_config
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NMTError
from nmt.models import scorer_of

IDENTITY_KEY = "nmt_identity"  # in a checkpoint: {"pair", "family", "attention", "pieces"}


def run_identity(config: Config, tokenizer: Tokenizer) -> dict[str, str]:
    """The identity of a run of ``config`` over ``tokenizer``: its language pair, model family,
    attention scorer (the family's default where the config leaves it out) and a digest of
    its SentencePiece vocabulary (``Tokenizer.vocabulary``: each id's piece and score, not the
    file's bytes, which differ between models trained on the same text on two machines)."""
    pieces = json.dumps(tokenizer.vocabulary(), ensure_ascii=False)
    return {"pair": f"{config.data.src_lang}->{config.data.tgt_lang}",
            "family": str(config.model.get("family")),
            "attention": str(scorer_of(config.model)),
            "pieces": hashlib.sha1(pieces.encode()).hexdigest()}


def identity_of_run(run_dir: Path) -> dict[str, str] | None:
    """``run_identity`` of the training run in ``run_dir``; None where it has no config.yaml
    or spm.model to tell it (a folder of checkpoints alone)."""
    if not ((run_dir / "config.yaml").is_file() and (run_dir / "spm.model").is_file()):
        return None
    return run_identity(run_config(run_dir), Tokenizer(run_dir / "spm.model"))


LOADED_WRONGLY = "its weights would translate wrongly there; use it with the run that trained it"


def check_identity(checkpoint: dict, expected: dict[str, str] | None, path: Path,
                   run_dir: Path | None, harm: str = LOADED_WRONGLY) -> None:
    """A one-line error where ``checkpoint`` (read from ``path``) holds an identity other than
    ``expected``, the identity of the run ``run_dir`` it is loaded into (or of the checkpoint
    it is averaged with), ending with ``harm``, what would go wrong. Nothing to check where
    either is unknown: a checkpoint from before identities were kept, a folder that is no run."""
    theirs = checkpoint.get(IDENTITY_KEY) if isinstance(checkpoint, dict) else None
    if expected is None or not isinstance(theirs, dict):
        return
    differs = {  # the plainest difference first
        "pair": f"trained {theirs.get('pair')}, not {expected['pair']} as {run_dir}",
        "family": f"a {theirs.get('family')} model, not {expected['family']} as {run_dir}",
        "attention": f"with {theirs.get('attention')} attention, not {expected['attention']} "
                     f"as {run_dir}",
        "pieces": f"over another SentencePiece model's pieces than {run_dir}'s",
    }
    for key, why in differs.items():
        if key in theirs and theirs[key] != expected[key]:
            raise NMTError(f"{path} is a checkpoint of another run, {why}: {harm}")
