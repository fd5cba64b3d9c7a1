"""The study's pictures, drawn from cell records: BLEU per cell, the head-size sweep, and
what each trained scorer attends to (cross-attention of every cell, the Transformer's
encoder self-attention per head)."""

from __future__ import annotations

from pathlib import Path

import torch

from nmt.plots import save_attention_grid, save_bar_chart, save_line_panels


def draw_figures(cfg, records: dict, rows: list[dict], folder: Path) -> None:
    main = [r for r in rows if r["group"] == rows[0]["group"]]
    save_bar_chart(folder / "bleu.png", [f"{r['family']}/{r['attention']}{_variant(r['variant'])}"
                                         for r in main],
                   [r["bleu"] for r in main], [r["bleu_std"] or 0.0 for r in main], "test BLEU",
                   f"BLEU per cell ({main[0]['group']}: mean ± std over seeds)")
    draw_head_size(rows, folder / "head_size.png")
    seed1 = {c: r for c, r in records.items() if c.seed == 1 and c.group == rows[0]["group"]}
    for line in cfg.plot_sentences:
        draw_cross(seed1, cfg, line, folder / f"cross_test{line + 1:04d}.png")
        draw_encoder(seed1, line, folder / f"encoder_test{line + 1:04d}.png")
    pictured = {f"{kind}_test{line + 1:04d}.png" for line in cfg.plot_sentences
                for kind in ("cross", "encoder")}
    for path in [*folder.glob("cross_test*.png"), *folder.glob("encoder_test*.png")]:
        if path.name not in pictured:  # a line no longer pictured: an earlier table's
            path.unlink()


def _variant(variant: str) -> str:
    """A cell's variant in a label, where it is not the base one: cells of one group may differ
    in it alone (the same family and scorer)."""
    return "" if variant == "base" else f" ({variant})"


def picture_of(record: dict, line: int) -> dict | None:
    """The record's picture of test line ``line`` (None past the test set's end)."""
    return next((picture for picture in record["pictures"] if picture["line"] == line), None)


def draw_head_size(rows: list[dict], path: Path) -> None:
    """BLEU, cross-attention logit spread and entropy against d_k, per scorer: the sweep's
    cells (one seed) and, at the configs' own d_k, the main group's cells (seed mean)."""
    swept = {r["attention"] for r in rows if r["group"] == "head_size"}
    if not swept:
        path.unlink(missing_ok=True)  # an earlier table's picture, not this one's
        return
    main = rows[0]["group"]  # its base cells have the configs' own d_k
    families = {r["family"] for r in rows if r["group"] == "head_size"}  # by their labels
    points = [r for r in rows if r["family"] in families and r["attention"] in swept
              and (r["group"] == "head_size" or (r["group"], r["variant"]) == (main, "base"))]
    panels = []
    for key, label in (("bleu", "test BLEU"), ("cross_logit_std", "cross-attention logit std"),
                       ("cross_entropy", "cross-attention entropy (nats)")):
        series = {}
        for attention in sorted(swept):
            mine = sorted((r["d_k"], r[key]) for r in points if r["attention"] == attention
                          and r.get(key) is not None)
            series[attention] = ([d for d, _ in mine], [v for _, v in mine])
        panels.append((label, series))
    save_line_panels(path, panels, "head size d_k (d_model fixed, heads = d_model / d_k)",
                     "Transformer: the head-size sweep", log_x=True)


def draw_cross(records: dict, cfg, line: int, path: Path) -> None:
    """Cross-attention of every seed-1 cell for one test sentence, one row per family."""
    panels = []
    columns = max(sum(1 for c in records if c.family == f) for f in cfg.families) or 1
    for family in cfg.families:
        mine = [(c, picture) for c, r in records.items()
                if c.family == family and (picture := picture_of(r, line)) is not None]
        for cell, picture in mine:
            panels.append((f"{family} / {cell.attention}{_variant(cell.variant)}",
                           torch.tensor(picture["cross"]),
                           picture["source"], picture["target"]))
        panels += [None] * ((-len(mine)) % columns)  # next family on a new row
    if any(panels):
        save_attention_grid(path, panels, columns=columns)
    else:
        path.unlink(missing_ok=True)  # an earlier table's cells' picture, not these cells'


def draw_encoder(records: dict, line: int, path: Path) -> None:
    """The last encoder layer's self-attention of every seed-1 Transformer cell: one row per
    scorer, one column per head, then the mean over heads. A cell of fewer heads than the
    widest (a head-size variant) leaves the rest of its row empty: the next cell's panels
    began on it, so a row mixed two cells under one row's worth of columns."""
    pictured = [(cell, torch.tensor(picture["encoder"]), picture["source"])  # (H, S, S)
                for cell, record in records.items()
                if (picture := picture_of(record, line)) is not None and "encoder" in picture]
    if not pictured:
        path.unlink(missing_ok=True)  # an earlier table's cells' picture, not these cells'
        return
    columns = max(weights.size(0) for _, weights, _ in pictured) + 1  # heads, then the mean
    panels = []
    for cell, weights, source in pictured:
        name = f"{cell.attention}{_variant(cell.variant)}"
        panels += [(f"{name} head {h}", matrix, source, source) for h, matrix in enumerate(weights)]
        panels.append((f"{name} mean", weights.mean(0), source, source))
        panels += [None] * (columns - len(weights) - 1)  # the next cell on a new row
    save_attention_grid(path, panels, columns=columns)
