"""What produced a result: the code's commit and the device, for training segments and
study records."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import torch

from nmt.precision import cpu_model

PACKAGE = Path(__file__).resolve().parent


def code_commit() -> str | None:
    """``git rev-parse HEAD`` of the checkout this package runs from (+ "-dirty" with local
    changes to tracked files). Outside a git checkout (an installed wheel, a copy of the work
    tree on a remote GPU machine): the variable NMT_CODE_COMMIT where the copier set it, else
    None."""
    try:
        head = subprocess.run(["git", "-C", str(PACKAGE), "rev-parse", "HEAD"],
                              capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "-C", str(PACKAGE), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("NMT_CODE_COMMIT")
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def device_name(device: torch.device | None = None) -> str:
    """The name of ``device`` (None: the GPU where there is one): the GPU's, or "CPU: <model>"."""
    cuda = torch.cuda.is_available() if device is None else device.type == "cuda"
    return torch.cuda.get_device_name(device) if cuda else f"CPU: {cpu_model()}"
