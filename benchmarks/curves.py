"""Learning curves and the issue-3 aims, computed from benchmarks/results/models.json (nothing typed by hand).

    python benchmarks/curves.py

Writes benchmarks/results/curves-<dataset>.png (validation NDCG@10 against wall time, one line per run) and
rebuilds the table between `<!-- aims:begin -->` and `<!-- aims:end -->` in benchmarks/RESULTS.md:
BERT4Rec ≥ 0.95 × SASRec's test NDCG@10 in ≤ 3 × SASRec's wall time to best; MOJITO ≥ SASRec. Each model is
compared with SASRec trained with full-softmax CE (our default, the stronger baseline) and with SASRec's own
paper loss (BCE, one negative) when that run exists. A comparison involving a run that did not stop by
early stopping is marked "not converged": it is a lower bound, not a verdict. The ratio's interval is a
paired bootstrap over test users (same users, same targets), for runs that stored per-user values.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "models.json"
MD = ROOT / "benchmarks" / "RESULTS.md"
CURVE_RUNS = ("mostpop", "sasrec:ce", "sasrec:bce", "bert4rec", "mojito")
BEGIN, END = "<!-- aims:begin -->", "<!-- aims:end -->"


def plot(dataset: str, rows: dict[str, dict], out: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for run in CURVE_RUNS:
        r = rows.get(run)
        if not r or not r.get("curve") or r["model"] == "mostpop":
            continue
        curve = r["curve"]
        ax.plot([p["seconds"] / 60 for p in curve], [p["valid_ndcg@10"] for p in curve], label=run)
    if "mostpop" in rows:
        ax.axhline(rows["mostpop"]["valid_ndcg@10"], color="grey", linestyle=":", label="mostpop")
    ax.set_xlabel("wall time (minutes)")
    ax.set_ylabel("validation NDCG@10")
    ax.set_title(f"{dataset}: validation NDCG@10 during training")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def ratio_interval(m: dict, b: dict, samples: int = 2000) -> str:
    """95 % paired-bootstrap interval of mean(model) / mean(SASRec) over the same test users; '' when a run
    predates per-user results."""
    a, c = m.get("test_per_user_ndcg@10"), b.get("test_per_user_ndcg@10")
    if not a or not c or len(a) != len(c):
        return ""
    x, y = np.asarray(a), np.asarray(c)
    idx = np.random.default_rng(0).integers(0, len(x), size=(samples, len(x)))
    ratios = x[idx].mean(1) / np.maximum(y[idx].mean(1), 1e-12)
    lo, hi = np.quantile(ratios, [0.025, 0.975])
    return f"[{lo:.2f}, {hi:.2f}]"


def converged(r: dict) -> bool:
    return r["stopped_by"] == "early_stopping"


def compare(dataset: str, model: str, base: str, rows: dict[str, dict]) -> str | None:
    m, b = rows.get(model), rows.get(base)
    if not m or not b:
        return None
    ratio = m["test_ndcg@10"] / b["test_ndcg@10"]
    ci = ratio_interval(m, b)
    time_ratio = m["seconds_to_best"] / max(b["seconds_to_best"], 1e-9)
    if model == "bert4rec":
        aim = "≥ 0.95 × NDCG, ≤ 3 × time"
        met = ratio >= 0.95 and time_ratio <= 3.0
    else:
        aim = "≥ 1.00 × NDCG"
        met = ratio >= 1.0
    note = "met" if met else "not met"
    if not (converged(m) and converged(b)):
        unconverged = [r["run"] for r in (m, b) if not converged(r)]
        note += f" (not converged: {', '.join(unconverged)})"
    return (
        f"| {dataset} | {model} vs {base} | {m['test_ndcg@10']:.4f} / {b['test_ndcg@10']:.4f} | {ratio:.2f} × {ci} "
        f"| {m['seconds_to_best']:.0f} / {b['seconds_to_best']:.0f} s | {time_ratio:.1f} × | {aim} | {note} |"
    )


def main() -> int:
    if not RESULTS.is_file():
        print(f"no results at {RESULTS}; run benchmarks/bench_models.py first", file=sys.stderr)
        return 1
    all_rows = json.loads(RESULTS.read_text())
    datasets = sorted({r["dataset"] for r in all_rows})
    lines = [
        "| dataset | comparison | test NDCG@10 (model / SASRec) | ratio [95 % paired bootstrap] | time to best (model / SASRec) "
        "| time ratio | aim | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for dataset in datasets:
        rows = {r["run"]: r for r in all_rows if r["dataset"] == dataset}
        out = RESULTS.parent / f"curves-{dataset}.png"
        plot(dataset, rows, out)
        print(f"wrote {out.relative_to(ROOT)}")
        for model in ("bert4rec", "mojito"):
            for base in ("sasrec:ce", "sasrec:bce"):
                line = compare(dataset, model, base, rows)
                if line:
                    lines.append(line)
    table = "\n".join(lines)
    text = MD.read_text()
    if BEGIN not in text:
        print(f"{MD.relative_to(ROOT)} has no {BEGIN} marker; table not written", file=sys.stderr)
        print(table)
        return 1
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    MD.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
