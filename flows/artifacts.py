"""Prefect artifacts: what a person sees in the UI after a run — tables, the gate's decision, curves.

Rendering only (Markdown, tables, a PNG of the validation curves); the flows decide when to publish. A retrain
run that changed nothing publishes only its (replayed) decision: the metrics table and the curves of the run
that last changed them still hold, and drawing the PNG costs a second of matplotlib.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from recsys.layout import VALID_COLUMN


def publish_ingest(summaries: list[dict[str, Any]]) -> None:
    if not summaries:
        create_markdown_artifact("# Ingest\n\nThe inbox was empty: nothing to validate.", key="validation-summary",
                                 description="Great Expectations validation of each batch")
        return
    create_table_artifact(
        [{k: s.get(k) for k in ("source", "status", "rows_in", "rows_accepted", "rows_quarantined",
                                "rows_duplicate", "data_version")} for s in summaries],
        key="ingest-batches", description="Batches ingested in this run",
    )
    parts = ["# Ingest: validation summary", ""]
    for s in summaries:
        parts += [f"## {s['source']}: {s['status']}", "", s["message"], ""]
        report = s.get("report_markdown")
        if report and Path(report).is_file():
            parts += [Path(report).read_text(encoding="utf-8"), ""]
    create_markdown_artifact("\n".join(parts), key="validation-summary",
                             description="Great Expectations validation of each batch")


def _fmt(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else ("—" if value is None else str(value))


def publish_retrain(results: dict[str, dict], decision: dict | None, curves: dict[str, list[dict]], ran: list[str]) -> None:
    create_table_artifact(metric_rows(results, decision), key="model-metrics",
                          description="Test metrics of every model vs the baseline")
    if decision:
        publish_decision(decision)
    create_markdown_artifact(curves_markdown(curves, ran), key="training-curves", description="Validation curves")


def metric_rows(results: dict[str, dict], decision: dict | None) -> list[dict]:
    """The model-metrics table: a row per model, then what the gate compared the candidate with."""
    rows = []
    for m, r in sorted(results.items()):
        rows.append({"model": m, "valid ndcg@10": _fmt((r.get("valid") or {}).get("ndcg@10")),
                     "test ndcg@10": _fmt(r.get("ndcg@10")), "test hr@10": _fmt(r.get("hr@10")),
                     "test mrr": _fmt(r.get("mrr")), "best epoch": _fmt(r.get("best_epoch")),
                     "candidate": "yes" if decision and decision["model"] == m else ""})
    if decision and decision.get("baseline_metric") is not None:
        version = decision["baseline_version"]  # None: an unregistered reference result (no version)
        rows.append({"model": decision["baseline_kind"] + (f" v{version}" if version else ""),
                     "valid ndcg@10": "—", "test ndcg@10": _fmt(decision["baseline_metric"]), "test hr@10": "—",
                     "test mrr": "—", "best epoch": "—", "candidate": "baseline (same test set)"})
    return rows


def publish_decision(decision: dict) -> None:
    verdict = "✅ promoted" if decision["promoted"] else "⛔ not promoted"
    md = [f"# Promotion decision: {verdict}", "",
          f"**Candidate:** `{decision['model']}` (registry version {decision['version']})", "",
          f"**Reason:** {decision['reason']}", "",
          "| | value |", "|---|---|",
          f"| metric | {decision['metric']} |",
          f"| candidate | {_fmt(decision['candidate_metric'])} |",
          f"| baseline ({decision['baseline_kind']}) | {_fmt(decision['baseline_metric'])} |",
          f"| delta | {_fmt(decision['delta'])} |", f"| p-value | {_fmt(decision['p_value'])} |",
          f"| evaluation set | `{(decision['eval_fingerprint'] or '')[:16]}` |",
          f"| replayed from an earlier run | {decision['replayed']} |"]
    create_markdown_artifact("\n".join(md), key="promotion-decision", description="Gate decision and reason")


def curves_markdown(curves: dict[str, list[dict]], ran: list[str]) -> str:
    lines = ["# Training curves (validation NDCG@10 by epoch)", "",
             f"Stages run this time: {', '.join(ran) or 'none — everything was up to date'}", ""]
    png = _curves_png(curves)
    if png:
        lines += [f"![validation NDCG@10](data:image/png;base64,{base64.b64encode(png).decode()})", ""]
    for m, rows in sorted(curves.items()):
        if not rows:
            continue
        best = max(rows, key=lambda r: r.get(VALID_COLUMN, float("-inf")))
        lines.append(f"- **{m}**: {len(rows)} epoch(s), best epoch {int(best['epoch'])} "
                     f"(valid NDCG@10 {best[VALID_COLUMN]:.4f}); `dvc plots show` renders plots/{m}.csv")
    return "\n".join(lines)


def _curves_png(curves: dict[str, list[dict]]) -> bytes | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    drawable = {m: rows for m, rows in curves.items() if len(rows) > 1}
    if not drawable:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=80)
    for m, rows in sorted(drawable.items()):
        ax.plot([r["epoch"] for r in rows], [r[VALID_COLUMN] for r in rows], label=m)
    ax.set_xlabel("epoch")
    ax.set_ylabel("valid NDCG@10")
    ax.legend()
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()
