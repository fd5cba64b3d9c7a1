"""The study's tables and charts, rebuilt from the committed cell records alone.

Significance, three ways (the README says which is which):
* ``BLEU`` is the mean ± sample standard deviation over seeds;
* ``p boot`` is sacreBLEU's paired bootstrap resampling of the test sentences, one p-value per
  seed, each against the same seed's baseline cell (same data order, same initial draw);
* ``p seeds`` is a paired t-test across seeds of the cell's BLEU against the baseline's
  (``paired_t_test``): does the difference exceed seed-to-seed variation? Undefined where
  the difference is the same on every seed.
"""

from __future__ import annotations

import csv
import json
import math
import os
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import mpmath
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from nmt.attention_stats import attention_key_size
from nmt.compare import Cell, CompareConfig, cell_key, cell_overrides, cells_of, same_options, scored_as_asked
from nmt.config import DataConfig, load_config
from nmt.data.corpus import test_set_name
from nmt.data.prepare import lines_sha1
from nmt.errors import NMTError
from nmt.evaluate import split_pairs
from nmt.files import atomic_path, write_atomic
from nmt.study_cell import read_hypotheses, read_record
from nmt.study_cost import cost_markdown
from nmt.study_figures import draw_figures


def current_records(cfg: CompareConfig, preset: str, out: Path, extra: list[str] | None = None,
                    seeds: int | None = None) -> tuple[dict[Cell, dict], list[str]]:
    """Records of the preset's cells (with the command line's ``extra`` options and ``seeds``)
    whose key still matches their resolved configuration, scored at the beam ``cfg`` asks; and
    the others recorded, each with why it is left out (compare without --tables-only trains
    or decodes them again; a trial's, made with other options than ``extra``, is tabled by
    the same command with its options)."""
    found, left_out = {}, []
    for cell in cells_of(cfg, preset, seeds):
        record = read_record(out / "cells" / cell.name)
        if record is None:
            continue
        key, _ = cell_key(cfg.families[cell.family], cell_overrides(cfg, preset, cell, extra or []))
        if record["key"] != key:
            left_out.append(f"{cell.name} ({other_options(record, extra or [])})")
        elif not scored_as_asked(record, cfg):
            left_out.append(f"{cell.name} (scored at beam {record['scores'].get('beam')}, "
                            f"not {cfg.beam})")
        else:
            record["hyps"] = read_hypotheses(out / "cells" / cell.name, record["scores"]["sentences"])
            found[cell] = record
    return found, left_out


def other_options(record: dict, extra: list[str]) -> str:
    """Why a record of another key is left out: made with other command-line options than
    ``extra`` (a trial's, or the preset's alone; named: the same options table it), else
    trained as the preset asked before it changed (or before records named their trial)."""
    if "trial" in record and not same_options(record["trial"], extra):
        made = " ".join(record["trial"]) or "the preset's options alone"
        return f"made with {made}: give the same options to table it"
    return "trained with other options"


# The seed of the paired bootstrap's resamples: sacreBLEU's default, which drew the committed
# study's p-values
BOOTSTRAP_SEED = 12345


@contextmanager
def pinned_bootstrap_seed() -> Iterator[None]:
    """``SACREBLEU_SEED`` set to ``BOOTSTRAP_SEED`` while sacreBLEU's paired test runs, and
    restored after. sacreBLEU reads its seed from that variable alone (no argument takes it):
    a user who had set it, for another tool, would otherwise get other p-values than the
    committed ones, with no sign of why."""
    before = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = str(BOOTSTRAP_SEED)
    try:
        yield
    finally:
        if before is None:
            del os.environ["SACREBLEU_SEED"]
        else:
            os.environ["SACREBLEU_SEED"] = before


def paired_bootstrap(baseline: list[str], systems: dict[str, list[str]], refs: list[str],
                     samples: int) -> tuple[dict[str, float], str | None]:
    """p-value of each system's BLEU against the baseline (sacreBLEU's paired bootstrap,
    ``samples`` resamples drawn with ``BOOTSTRAP_SEED``), and sacreBLEU's signature of the
    test (BLEU's with ``bs:<samples>|seed:<seed>``; None where none ran). A system of the
    baseline's BLEU differs from it by nothing: 1.0 (as a two-sided test of a zero difference
    gives), where sacreBLEU's bootstrap can give its smallest p, 1 / (samples + 1), which
    reads as significant: it counts the resamples whose difference strictly exceeds the real
    one, and none can where every resample scores the two alike (the same translations; both
    at BLEU 0, as a smoke test's cells)."""
    p_values = {name: 1.0 for name, hyps in systems.items() if hyps == baseline}
    named = [("baseline", baseline), *[(n, h) for n, h in systems.items() if n not in p_values]]
    if len(named) == 1:
        return p_values, None
    with pinned_bootstrap_seed():
        test = PairedTest(named, {"BLEU": BLEU()}, [refs], test_type="bs", n_samples=samples,
                          n_jobs=1)
        signatures, results = test()
    base, *rivals = results["BLEU"]  # in the order of ``named``, the baseline first
    p_values |= {name: 1.0 if r.score == base.score else r.p_value
                 for name, r in zip(results["System"][1:], rivals)}
    return p_values, str(signatures["BLEU"])


def bootstrap_p_values(cfg: CompareConfig, records: dict[Cell, dict],
                       references: Callable[[Cell, dict], list[str]]
                       ) -> tuple[dict[Cell, float], set[str]]:
    """Each non-baseline cell against the baseline cell of its group, variant and seed, on
    the test references of that cell (``references``: a variant may test on other files);
    and the signatures of the tests run (see ``paired_bootstrap``)."""
    p_values, signatures = {}, set()
    for base in [c for c in records if c.attention == cfg.baselines[c.family]]:
        same = (base.group, base.family, base.variant, base.seed)
        rivals = {c: r for c, r in records.items()
                  if c != base and (c.group, c.family, c.variant, c.seed) == same}
        refs = references(base, records[base])
        for cell, record in rivals.items():  # each rival scored on these references too
            if references(cell, record) != refs:
                raise NMTError(f"cells {base.name} and {cell.name} were tested on other "
                               "references: their translations cannot be paired")
        found, signature = paired_bootstrap(records[base]["hyps"],
                                            {c.name: r["hyps"] for c, r in rivals.items()},
                                            refs, cfg.bootstrap_samples)
        p_values.update({c: found[c.name] for c in rivals})
        signatures |= {signature} - {None}
    return p_values, signatures


def test_references(cfg: CompareConfig, preset: str, extra: list[str]
                    ) -> Callable[[Cell, dict], list[str]]:
    """A cell's test references, read from its own configuration's corpus (each corpus once),
    checked against what its record was scored on: as many sentences, and where the record
    notes them, the same (a test file changed since would pair translations with other
    sentences' references)."""
    corpora: dict[str, list[str]] = {}

    def references(cell: Cell, record: dict) -> list[str]:
        data = cell_data(cfg, preset, cell, extra)
        name = json.dumps(asdict(data), sort_keys=True)
        if name not in corpora:
            corpora[name] = split_pairs(data, "test")[1]  # one line where it has no test split
        refs = corpora[name]
        noted = record.get("references_sha1")
        then = record["scores"]["sentences"]
        if len(refs) != then or noted not in (None, lines_sha1(refs)):
            how = f"{then} sentences then, {len(refs)} now" if len(refs) != then else \
                f"the same {then} sentences, other text"
            raise NMTError(f"the test references of cell {cell.name} are not those it was scored "
                           f"on ({how}): restore the test files, or delete the cell's folder and "
                           "compare records it again")
        return refs

    return references


def cell_data(cfg: CompareConfig, preset: str, cell: Cell, extra: list[str]) -> DataConfig:
    """The data section of a cell's configuration (its corpus, pair and test set)."""
    return load_config(cfg.families[cell.family], cell_overrides(cfg, preset, cell, extra)).data


def _mean(values: list[float], digits: int = 2) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.fmean(values), digits) if values else None


def summarise(cfg: CompareConfig, records: dict[Cell, dict], p_boot: dict[Cell, float]) -> list[dict]:
    """One row per (group, family, attention, variant): means over its seeds."""
    rows = []
    for group, family, attention, variant in dict.fromkeys(
            (c.group, c.family, c.attention, c.variant) for c in records):
        mine = {c.seed: r for c, r in records.items() if (c.group, c.family, c.attention, c.variant)
                == (group, family, attention, variant)}
        base = {c.seed: r for c, r in records.items() if (c.group, c.family, c.variant) ==
                (group, family, variant) and c.attention == cfg.baselines[family]}
        bleus = [r["scores"]["bleu"] for r in mine.values()]
        stats = [r["attention_stats"] for r in mine.values()]
        model = next(iter(mine.values()))["config"]["model"]
        row = {
            "group": group, "family": family, "attention": attention, "variant": variant,
            "d_k": attention_key_size(model),
            "seeds": len(bleus), "seed_numbers": sorted(mine), "bleu": _mean(bleus),
            "bleu_std": round(statistics.stdev(bleus), 2) if len(bleus) > 1 else None,
            "chrf": _mean([r["scores"]["chrf"] for r in mine.values()]),
            "is_baseline": attention == cfg.baselines[family],
            # one a seed, in the seeds' order; None for a seed without its baseline cell
            "p_boot": [] if attention == cfg.baselines[family] else
            [round(p_boot[c], 4) if c in p_boot else None
             for c in (Cell(group, family, attention, variant, seed) for seed in sorted(mine))],
            "p_seeds": seed_test(mine, base, attention == cfg.baselines[family]),
            "parameters": next(iter(mine.values()))["train"]["parameters"],
            "steps": steps_of(mine),
            "decode_sent_per_s": _mean([r["decode_sent_per_s"] for r in mine.values()], 1),
        }
        for kind in ("cross", "encoder"):
            for stat in ("logit_std", "entropy", "diagonal_mass"):
                values = [s.get(kind, {}).get(stat) for s in stats]
                if any(v is not None for v in values):
                    row[f"{kind}_{stat}"] = _mean(values, 3)
        rows.append(row)
    return rows


def steps_of(mine: dict[int, dict]) -> int | str:
    """The updates the seeds of a row trained: one number, or their range where they differ
    (early stopping ends each seed at its own update)."""
    steps = sorted({r["train"]["steps"] for r in mine.values()})
    return steps[0] if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"


def seed_test(mine: dict[int, dict], base: dict[int, dict], is_baseline: bool) -> float | None:
    """Paired t-test across the seeds both cells have: None below two seeds, and where the
    BLEU difference is the same on every seed (1.0 where that difference is 0). With no spread
    the t statistic is infinite and its p is 0, a certainty that two or three seeds cannot
    give: BLEU kept to 2 decimals makes equal differences a matter of luck."""
    seeds = sorted(set(mine) & set(base))
    if is_baseline or len(seeds) < 2:
        return None
    a = [mine[s]["scores"]["bleu"] for s in seeds]
    b = [base[s]["scores"]["bleu"] for s in seeds]
    # BLEU has 2 decimals: rounding drops the subtraction's float noise (0.38000000000000256)
    differences = {round(x - y, 6) for x, y in zip(a, b)}
    if len(differences) == 1:
        return 1.0 if differences == {0} else None
    return round(paired_t_test(a, b), 4)


def paired_t_test(a: list[float], b: list[float]) -> float:
    """The two-sided p-value of the paired t-test of ``a`` against ``b`` (scipy's ``ttest_rel``).

    Over the n differences d = a - b, with n - 1 = v degrees of freedom:
        t = mean(d) / (sd(d) / sqrt(n)),    p = P(|T_v| >= |t|) = I_{v / (v + t^2)}(v / 2, 1 / 2),
    I the regularized incomplete beta function (mpmath's). Not scipy for it: installed, scipy
    made every process that imports Lightning (each training) ~1.2 s slower to start, as
    torchmetrics imports scipy.signal wherever scipy is (``import nmt.training``: 9.7 s
    against 8.5 s on a 2-core AMD EPYC Zen 3). The differences must not all be equal.
    """
    d = [x - y for x, y in zip(a, b)]
    v = len(d) - 1
    t = statistics.mean(d) / (statistics.stdev(d) / math.sqrt(len(d)))
    return float(mpmath.betainc(v / 2, 0.5, 0, v / (v + t * t), regularized=True))


COLUMNS = [("family", "family"), ("attention", "attention"), ("variant", "variant"),
           ("d_k", "d_k"), ("seeds", "seeds"), ("BLEU", "bleu"), ("p boot (per seed)", "p_boot"),
           ("p seeds", "p_seeds"), ("chrF", "chrf"), ("cross entropy", "cross_entropy"),
           ("diagonal mass", "cross_diagonal_mass"), ("cross logit std", "cross_logit_std"),
           ("enc. entropy", "encoder_entropy"), ("enc. logit std", "encoder_logit_std"),
           ("params", "parameters"), ("steps", "steps")]


def _cell_text(row: dict, key: str) -> str:
    value = row.get(key)
    if key == "bleu" and row["bleu_std"] is not None:
        return f"{value} ± {row['bleu_std']}"
    if key in ("p_boot", "p_seeds") and row["is_baseline"]:
        return "baseline"
    if key == "p_boot":
        texts = ["-" if p is None else str(p) for p in value]
        if row["seed_numbers"] != list(range(1, len(texts) + 1)):  # seeds 2 and 3, say
            texts = [f"seed {seed}: {text}" for seed, text in zip(row["seed_numbers"], texts)]
        return " / ".join(texts) or "-"
    return "-" if value is None else str(value)


def markdown(rows: list[dict], signatures: list[str], test_sets: list[str],
             bootstrap: set[str]) -> str:
    """One table per group; the footnote names the cells' BLEU ``signatures`` and ``test_sets``
    (each once) and the signatures of the paired ``bootstrap`` tests behind p boot (its number
    of resamples and seed)."""
    lines = []
    for group in dict.fromkeys(r["group"] for r in rows):
        lines += [f"### {group}", "", "| " + " | ".join(t for t, _ in COLUMNS) + " |",
                  "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(_cell_text(r, k) for _, k in COLUMNS) + " |"
                  for r in rows if r["group"] == group]
        lines.append("")
    tested = test_sets[0] if len(test_sets) == 1 else f"each cell's own test set ({', '.join(test_sets)})"
    scored = (f"sacreBLEU `{signatures[0]}`" if len(signatures) == 1 else
              "sacreBLEU as each cell was scored (`" + "`, `".join(signatures) + "`)")
    tests = "`, `".join(sorted(bootstrap))
    how = f" (sacreBLEU `{tests}`; bs: resamples, seed: their random seed)" if tests else ""
    lines += [f"{scored}, {tested}, beam search. BLEU: mean ± std over seeds; "
              f"p boot: two-sided paired bootstrap{how} per seed against the same seed's "
              "baseline; p seeds: paired t-test across seeds against the baseline (- where the two "
              "share fewer than two seeds, or differ by the same BLEU on every seed: with no "
              "spread the t-test is undefined, not p = 0). Neither is corrected for multiple "
              "comparisons."]
    return "\n".join(lines) + "\n"


def provenance_markdown(records: dict[Cell, dict]) -> str:
    """Where each cell ran: every training segment's code commit, start step and device
    (records written before segments were kept say so), the checkpoint its scores came from
    (a table whose cells differ in it compares unlike weights), and the commit that recorded it."""
    lines = ["### where each cell ran", "",
             "| cell | training segments: code from step (device) | precision | weights | recorded by |",
             "|---|---|---|---|---|"]
    for cell, record in records.items():
        segments = record["train"].get("segments")
        trained = "; ".join(f"{_short(s['code'])} from {s['from_step']} ({s['device'] or 'unknown'})"
                            for s in segments) if segments else "not kept (trained before they were)"
        prov = record["provenance"]
        precision = ((prov["precision"] or "").split() or ["unknown"])[0]  # without the probe's reason
        lines.append(f"| {cell.name} | {trained} | {precision} | {decoded_weights(record)} | "
                     f"{_short(prov['code'])}, {prov['device']} |")
    return "\n".join(lines) + "\n"


def decoded_weights(record: dict) -> str:
    """The checkpoint file a cell's test scores came from. Records from before it was kept
    name none: those decoded the run's choice where training recorded one (since f76e373),
    else best.ckpt."""
    return record.get("weights") or record["train"].get("final_weights") or "best.ckpt"


def _short(commit: str | None) -> str:
    """A commit as git abbreviates it (7 hex digits), keeping a "-dirty" mark."""
    if commit is None:
        return "unknown"
    return commit[:7] + ("-dirty" if commit.endswith("-dirty") else "")


def cost_table(path: Path, rows: list[dict]) -> str:
    """The cost table of ``compare --cost``'s file; a one-line error where it is not one."""
    try:
        return cost_markdown(json.loads(path.read_text(encoding="utf-8")), rows)
    # not JSON, not its fields, or lengths of no spread to fit (a ZeroDivisionError)
    except (ValueError, KeyError, TypeError, AttributeError, ArithmeticError):
        raise NMTError(f"{path} is not compare --cost's measurement; delete it, and compare "
                       "--cost measures again") from None


def write_report(cfg: CompareConfig, preset: str, out: Path, extra: list[str] | None = None,
                 seeds: int | None = None) -> list[dict]:
    """compare.{md,json,csv} and the figures of every recorded cell (see ``current_records``)."""
    records, left_out = current_records(cfg, preset, out, extra, seeds)
    left_out_note = ("Left out of the tables, recorded otherwise than this command asks: "
                     f"{'; '.join(left_out)}." if left_out else "")
    if left_out_note:
        print(left_out_note, flush=True)
    if not records:
        print("no cell recorded as this command asks: nothing to table", flush=True)
        return []
    p_boot, bootstrap = bootstrap_p_values(cfg, records, test_references(cfg, preset, extra or []))
    rows = summarise(cfg, records, p_boot)
    # as each cell was scored (records from before this was kept: as its config names it now)
    test_sets = sorted({record.get("test_set") or test_set_name(cell_data(cfg, preset, cell, extra or []))
                        for cell, record in records.items()})
    # every signature the cells were scored with: the first alone hid another sacreBLEU version
    signatures = sorted({record["scores"]["bleu_signature"] for record in records.values()})
    table = markdown(rows, signatures, test_sets, bootstrap)
    if left_out_note:
        table += "\n" + left_out_note + "\n"
    if (out / "cost.json").is_file():
        table += "\n" + cost_table(out / "cost.json", rows)
    table += "\n" + provenance_markdown(records)
    write_atomic(out / "compare.md", table)
    write_atomic(out / "compare.json", json.dumps(rows, indent=1) + "\n")
    with atomic_path(out / "compare.csv") as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=sorted({k for r in rows for k in r}))
        writer.writeheader()
        writer.writerows(rows)
    draw_figures(cfg, records, rows, out / "figures")
    print(table, flush=True)
    return rows
