"""``nmt compare``: the attention study, {families} x {scorers} x seeds, with one command.

Every cell is an ordinary training run (its own run directory under ``<out>/runs``), trained
in a child process so that its time and peak memory are its own. Finished cells are reused,
so an interrupted comparison continues where it stopped. Each cell is then decoded with beam
search on the test split and scored with sacreBLEU; every cell is tested against its
family's baseline scorer with sacreBLEU's paired bootstrap resampling.
"""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from nmt.config import load_config
from nmt.data.corpus import load_corpus
from nmt.errors import NMTError
from nmt.files import write_atomic
from nmt.plots import attention_matrix, save_attention_grid, save_bar_chart, save_scatter
from nmt.translator import Translator


@dataclass
class CompareConfig:
    name: str = "attention"
    families: dict[str, str] = field(default_factory=lambda: {
        "rnn": "configs/rnn_bahdanau.yaml", "transformer": "configs/transformer.yaml"})
    attentions: list[str] = field(default_factory=lambda: ["additive", "dot", "general", "scaled_dot"])
    baselines: dict[str, str] = field(default_factory=lambda: {
        "rnn": "additive", "transformer": "scaled_dot"})
    seeds: int = 1
    beam: int = 5
    bootstrap_samples: int = 1000
    plot_sentences: list[int] = field(default_factory=lambda: [0, 1, 2])  # test-set lines
    # preset -> {"all" | family: [training overrides]}
    presets: dict[str, dict[str, list[str]]] = field(default_factory=dict)


@dataclass
class Cell:
    family: str
    attention: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.family}_{self.attention}_seed{self.seed}"


def load_compare_config(path: str | None) -> CompareConfig:
    schema = OmegaConf.structured(CompareConfig)
    try:
        layers = [OmegaConf.create(yaml.safe_load(Path(path).read_text()) or {})] if path else []
        return OmegaConf.to_object(OmegaConf.merge(schema, *layers))
    except FileNotFoundError:
        raise NMTError(f"compare config not found: {path}") from None
    except OmegaConfBaseException as err:
        raise NMTError(f"bad compare config: {str(err).splitlines()[0]}") from None


def train_cell(cell: Cell, base_config: str, overrides: list[str], runs: Path) -> Path:
    """Train one cell in a child process, unless its run directory says it is finished."""
    run_dir = runs / cell.name
    if (run_dir / "train_stats.json").is_file():
        print(f"  {cell.name}: trained already, reused", flush=True)
        return run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "nmt", "train", "--config", base_config,
               "--run-dir", str(run_dir), "--attention", cell.attention, "--seed", str(cell.seed),
               "trainer.enable_progress_bar=false", *overrides]
    print(f"  {cell.name}: training (log: {run_dir / 'train.log'})", flush=True)
    with open(run_dir / "train.log", "a") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise NMTError(f"training {cell.name} failed; see {run_dir / 'train.log'}")
    return run_dir


def decode_cell(run_dir: Path, split_src: list[str], beam: int) -> dict:
    """Beam-search the test split once (cached in the run directory); time it."""
    cache = run_dir / f"compare_decode.beam{beam}.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    translator = Translator.from_run_dir(run_dir)
    start = time.perf_counter()
    hyps = [h[0].text for h in translator.translate(split_src, beam_size=beam)]
    seconds = time.perf_counter() - start
    result = {"hypotheses": hyps, "decode_sent_per_s": round(len(split_src) / seconds, 2)}
    write_atomic(cache, json.dumps(result))
    return result


def score(hyps: list[str], refs: list[str]) -> dict:
    bleu, bleu_lc, chrf = BLEU(), BLEU(lowercase=True, tokenize="13a"), CHRF()
    return {
        "bleu": bleu.corpus_score(hyps, [refs]).score,
        "bleu_lc": bleu_lc.corpus_score(hyps, [refs]).score,
        "chrf": chrf.corpus_score(hyps, [refs]).score,
        "signature": str(bleu.get_signature()),
        "signature_lc": str(bleu_lc.get_signature()),
    }


def paired_bootstrap(baseline: list[str], systems: dict[str, list[str]], refs: list[str],
                     samples: int) -> dict[str, float]:
    """p-value of each system's BLEU against the baseline (sacreBLEU's paired bootstrap)."""
    if not systems:
        return {}
    named = [("baseline", baseline), *systems.items()]
    test = PairedTest(named, {"BLEU": BLEU()}, [refs], test_type="bs", n_samples=samples, n_jobs=1)
    _, results = test()
    return {name: r.p_value for name, r in zip(results["System"][1:], results["BLEU"][1:])}


def cell_overrides(cfg: CompareConfig, preset: str, family: str, extra: list[str]) -> list[str]:
    chosen = cfg.presets[preset]
    return [*chosen.get("all", []), *chosen.get(family, []), *extra]


def run_compare(cfg: CompareConfig, preset: str, out: Path, extra: list[str]) -> list[dict]:
    """Train, decode and score every cell; write the table, charts and heatmaps to ``out``."""
    if preset not in cfg.presets:
        raise NMTError(f"unknown preset '{preset}'; choose one of: {', '.join(cfg.presets)}")
    for family, scorer in cfg.baselines.items():
        if family in cfg.families and scorer not in cfg.attentions:
            raise NMTError(f"baseline '{scorer}' of {family} is not among the attentions compared")
    cells = [Cell(f, a, s) for f in cfg.families for a in cfg.attentions
             for s in range(1, cfg.seeds + 1)]
    print(f"{len(cells)} cells, preset {preset}, results in {out}", flush=True)
    runs = {c.name: train_cell(c, cfg.families[c.family],
                               cell_overrides(cfg, preset, c.family, extra), out / "runs")
            for c in cells}

    test = load_corpus(load_config(runs[cells[0].name] / "config.yaml").data)["test"]  # shared
    sources, refs = list(test["src"]), list(test["tgt"])
    results = {}
    for c in cells:
        print(f"  {c.name}: decoding test (beam {cfg.beam})", flush=True)
        decoded = decode_cell(runs[c.name], sources, cfg.beam)
        stats = json.loads((runs[c.name] / "train_stats.json").read_text())
        results[c.name] = {"cell": c, "hyps": decoded["hypotheses"], **score(decoded["hypotheses"], refs),
                           "decode_sent_per_s": decoded["decode_sent_per_s"], **stats}
    p_values = significance(cfg, cells, results, refs)
    rows = summarise(cfg, cells, results, p_values)
    write_outputs(rows, out)
    plot_heatmaps(cfg, cells, runs, sources, out / "attention")
    return rows


def significance(cfg, cells, results, refs) -> dict[str, float]:
    """p-value of every non-baseline cell against its family's baseline of the same seed."""
    p_values = {}
    for family in cfg.families:
        for seed in range(1, cfg.seeds + 1):
            base = Cell(family, cfg.baselines[family], seed).name
            others = {c.name: results[c.name]["hyps"] for c in cells
                      if c.family == family and c.seed == seed and c.name != base}
            p_values.update(paired_bootstrap(results[base]["hyps"], others, refs,
                                             cfg.bootstrap_samples))
    return p_values


def summarise(cfg, cells, results, p_values) -> list[dict]:
    """One row per (family, attention): means over seeds, BLEU's std, seed-1 p-value."""
    rows = []
    for family in cfg.families:
        for attention in cfg.attentions:
            runs = [results[c.name] for c in cells if (c.family, c.attention) == (family, attention)]

            def mean(key: str, runs: list[dict] = runs) -> float:
                return statistics.fmean(r[key] for r in runs)

            bleus = [r["bleu"] for r in runs]
            first = Cell(family, attention, 1).name
            rows.append({
                "family": family, "attention": attention, "seeds": len(runs),
                "bleu": round(statistics.fmean(bleus), 2),
                "bleu_std": round(statistics.stdev(bleus), 2) if len(bleus) > 1 else 0.0,
                "chrf": round(mean("chrf"), 2), "bleu_lc_13a": round(mean("bleu_lc"), 2),
                "p_vs_baseline": None if cfg.baselines[family] == attention
                else round(p_values[first], 4),
                "baseline": cfg.baselines[family],
                "parameters": runs[0]["parameters"],
                "train_minutes": round(mean("wall_seconds") / 60, 2),
                "train_tok_per_s": round(mean("tgt_tok_per_s"), 1),
                "decode_sent_per_s": round(mean("decode_sent_per_s"), 1),
                "peak_rss_mb": round(max(r["peak_rss_mb"] for r in runs), 1),
                "epochs": round(mean("epochs"), 1),
                "signature": runs[0]["signature"], "signature_lc": runs[0]["signature_lc"],
            })
    return rows


MARKDOWN_COLUMNS = [
    ("family", "family"), ("attention", "attention"), ("BLEU", "bleu"), ("chrF", "chrf"),
    ("BLEU lc-13a", "bleu_lc_13a"), ("p vs baseline", "p_vs_baseline"), ("params", "parameters"),
    ("train min", "train_minutes"), ("train tok/s", "train_tok_per_s"),
    ("decode sent/s", "decode_sent_per_s"), ("peak RSS MB", "peak_rss_mb"),
]


def markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(title for title, _ in MARKDOWN_COLUMNS) + " |",
             "|" + "---|" * len(MARKDOWN_COLUMNS)]
    for row in rows:
        cells = []
        for _, key in MARKDOWN_COLUMNS:
            value = row[key]
            if key == "bleu" and row["seeds"] > 1:
                value = f"{value} ± {row['bleu_std']}"
            elif key == "p_vs_baseline" and value is None:
                value = "baseline"
            cells.append(str(value))
        lines.append("| " + " | ".join(cells) + " |")
    signatures = sorted({r["signature"] for r in rows} | {r["signature_lc"] for r in rows})
    lines += ["", "sacreBLEU signatures: " + "; ".join(f"`{s}`" for s in signatures),
              "p: paired bootstrap resampling (sacreBLEU) against the family's baseline scorer."]
    return "\n".join(lines) + "\n"


def write_outputs(rows: list[dict], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    table = markdown(rows)
    (out / "compare.md").write_text(table)
    (out / "compare.json").write_text(json.dumps(rows, indent=2) + "\n")
    with open(out / "compare.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    labels = [f"{r['family']}/{r['attention']}" for r in rows]
    save_bar_chart(out / "bleu.png", labels, [r["bleu"] for r in rows],
                   [r["bleu_std"] for r in rows], "test BLEU", "BLEU per cell (mean ± std over seeds)")
    save_scatter(out / "cost.png", [r["train_minutes"] for r in rows], [r["bleu"] for r in rows],
                 labels, "training time (minutes)", "test BLEU", "Quality against training cost")
    print(table)


def plot_heatmaps(cfg, cells, runs, sources, folder: Path) -> None:
    """For each chosen test sentence, the attention of every cell (seed 1) side by side."""
    lines = [i for i in cfg.plot_sentences if i < len(sources)]
    panels = {i: [] for i in lines}
    for c in (c for c in cells if c.seed == 1):
        translator = Translator.from_run_dir(runs[c.name])
        found = translator.translate([sources[i] for i in lines], cfg.beam, need_attn=True)
        for i, hyps in zip(lines, found):
            best = hyps[0]
            if best.attention is not None:
                panels[i].append((f"{c.family} / {c.attention}", attention_matrix(best.attention),
                                  best.source, best.pieces + ["</s>"]))
    for i, grid in panels.items():
        if grid:
            save_attention_grid(folder / f"test_{i + 1:04d}.png", grid, columns=len(cfg.attentions))
