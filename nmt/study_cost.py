"""The study's cost table: what each scorer costs to train, measured on a quiet machine.

Cells train while other work may share the CPU, so their wall-clock times say little. Cost
comes instead from ``nmt bench train`` of each (family, scorer) of the main group, with the
cells' own configuration, each in a fresh process, one after the other, and from ``nmt bench
attention`` (each scorer alone as length grows). ``nmt compare --cost`` writes
``<out>/cost.json``; the report tables it next to the quality.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

from nmt.bench_attention import RSS_RESOLUTION_MB, scorer_exponents
from nmt.compare import CompareConfig, cell_overrides, cells_of
from nmt.errors import NMTError
from nmt.files import write_atomic
from nmt.precision import cpu_identity

TRAIN_KEYS = ("tgt_tok_per_s", "sec_per_step", "train_gflop_per_tgt_token", "mfu",
              "peak_rss_mb", "precision", "device")  # mfu: against the peak of the precision used


def _bench(arguments: list[str]) -> dict:
    """Run ``nmt bench ...`` in a fresh process; its last line is the JSON summary."""
    done = subprocess.run([sys.executable, "-m", "nmt", "bench", *arguments],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise NMTError(f"nmt bench {' '.join(arguments[:3])} failed: {done.stderr.strip()[-300:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_cost(cfg: CompareConfig, preset: str, out: Path, steps: int = 20, warmup: int = 3,
                 max_len: int = 512, extra: list[str] = ()) -> dict:
    """Bench every (family, scorer) of the main group at seed 1, with the cells' options
    (``extra``: the command line's, as the cells'); write ``out/cost.json``."""
    cells = cells_of(cfg, preset)
    main = [c for c in cells if c.seed == 1 and c.variant == "base" and c.group == cells[0].group]
    rows = []
    for cell in main:
        print(f"  {cell.family}/{cell.attention}: bench train ({steps} steps)", flush=True)
        summary = _bench(["train", "--config", cfg.families[cell.family], "--steps", str(steps),
                          "--warmup", str(warmup), *cell_overrides(cfg, preset, cell, list(extra))])
        rows.append({"family": cell.family, "attention": cell.attention,
                     **{key: summary.get(key) for key in TRAIN_KEYS}})
    print(f"  scorers alone: bench attention (lengths 16..{max_len})", flush=True)
    plot = out / "figures" / "cost_attention.png"
    attention = _bench(["attention", "--max-len", str(max_len), "--plot", str(plot)])
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    cost = {"cpu": cpu_identity(), "measured": now, "steps": steps, "options": list(extra),
            "train": rows,
            "attention": {"rows": attention["rows"], "batch": attention["batch"],
                          "heads": attention["heads"], "head_dim": attention["head_dim"]}}
    write_atomic(out / "cost.json", json.dumps(cost, indent=1) + "\n")
    return cost


def _mfu(row: dict) -> float:
    """A cost row's MFU against its precision's peak: ``mfu`` since 2026-11-26, when ``nmt bench
    train`` renamed it; ``mfu_at_precision`` in the cost files measured before."""
    return row["mfu"] if "mfu" in row else row["mfu_at_precision"]


def cost_markdown(cost: dict, rows: list[dict]) -> str:
    """The training-cost table with each scorer's mean BLEU (main group) beside it."""
    bleu = {(r["family"], r["attention"]): r["bleu"] for r in rows if r["variant"] == "base"
            and r["group"] == rows[0]["group"]}
    # bench train runs where training would (a GPU), bench attention on the CPU; files
    # measured before the rows named their device say the CPU alone
    accelerators = sorted({r["device"] for r in cost["train"]
                           if isinstance(r.get("device"), str) and not r["device"].startswith("CPU")})
    machine = (f"{', '.join(accelerators)}, host CPU {cost['cpu']}" if accelerators
               else cost["cpu"])
    # the command line's options it was benched with (a trial's); none in files from before
    options = f" with {' '.join(cost['options'])}" if cost.get("options") else ""
    lines = [f"### cost (`nmt bench train`, {cost['steps']} steps each{options}, quiet machine: "
             f"{machine}, {cost['measured']})", "",
             "| family | attention | train tgt tok/s | s/step | GFLOP per tgt token | MFU | peak RSS MB "
             "| precision | test BLEU |", "|---|---|---|---|---|---|---|---|---|"]
    for r in cost["train"]:
        lines.append(f"| {r['family']} | {r['attention']} | {r['tgt_tok_per_s']} | {r['sec_per_step']} | "
                     f"{r['train_gflop_per_tgt_token']} | {_mfu(r)} | {r['peak_rss_mb']} | "
                     f"{r['precision']} | {bleu.get((r['family'], r['attention']), '-')} |")
    attention = cost["attention"]["rows"]
    longest = max(r["length"] for r in attention)
    lines += ["", f"Scorers alone (`nmt bench attention`{', on the CPU' if accelerators else ''}): "
              "time ~ length^k, peak memory ~ length^m "
              f"(m: - where the peaks are under the RSS resolution, {RSS_RESOLUTION_MB:.0f} MB); "
              f"peak MB at length {longest}: " +
              ", ".join(_scorer_cost(name, attention, longest)
                        for name in dict.fromkeys(r["scorer"] for r in attention)), ""]
    return "\n".join(lines) + "\n"


def _scorer_cost(name: str, rows: list[dict], longest: int) -> str:
    """One scorer's growth exponents and peak memory at the ``longest`` length, from
    ``nmt bench attention``'s rows. A point that did not fit (out of memory, its process
    killed) is a row with an ``error`` and no numbers, the scorer's last: the exponents are
    of the points measured (as the bench's own), and the peak says where it stopped."""
    mine = [r for r in rows if r["scorer"] == name]
    measured = [r for r in mine if "error" not in r]
    exponents = scorer_exponents(measured).get(name)
    k = "-" if exponents is None else exponents["time"]
    m = "-" if exponents is None or exponents["memory"] is None else exponents["memory"]
    at_longest = next((r for r in measured if r["length"] == longest), None)
    failed = next((r for r in mine if "error" in r), None)
    if at_longest is not None:
        peak = f"{at_longest['peak_mb']} MB"
    elif failed is not None:
        peak = f"{failed['error']} at length {failed['length']}"
    else:
        peak = "not measured"
    return f"{name} k={k} m={m} {peak}"
