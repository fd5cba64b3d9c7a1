"""Plot validation BLEU against wall-clock minutes for one or more run directories.

    python scripts/learning_curve.py checkpoints/RUN_A checkpoints/RUN_B --out curve.png

Reads the runs' CSV logs (``logs/version_*/metrics.csv``, resumed segments in order).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from nmt.errors import NMTError, run_script
from nmt.plots import save_lines


def curve(run_dir: Path) -> tuple[list[float], list[float]]:
    """(wall minutes, validation BLEU) at each validation of the run. A folder without logs
    (a mistyped run) is a one-line error: it was drawn as an empty curve."""
    points = []
    logs = list((run_dir / "logs").glob("version_*/metrics.csv"))
    if not logs:
        raise NMTError(f"{run_dir}: no training logs there (logs/version_*/metrics.csv): give a "
                       "run directory")
    for log in sorted(logs, key=lambda path: int(path.parent.name.split("_")[1])):  # 2 before 10
        with open(log) as f:
            points += [(float(r["wall_minutes"]), float(r["val_bleu"])) for r in csv.DictReader(f)
                       if r.get("wall_minutes") and r.get("val_bleu")]
    return [m for m, _ in points], [b for _, b in points]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # the first paragraph
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", default="learning_curve.png")
    args = parser.parse_args()
    series = {run.name: curve(run) for run in args.runs}
    save_lines(args.out, series, "wall-clock minutes", "validation BLEU (greedy)",
               "Learning curve")
    for name, (minutes, bleu) in series.items():
        print(name, " ".join(f"{m:.1f}min:{b:.2f}" for m, b in zip(minutes, bleu)))


if __name__ == "__main__":
    run_script(main)
