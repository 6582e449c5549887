"""What a run tells people: the per-batch summary, its one-line message, and the report files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from recsys import validation

Status = Literal["ingested", "duplicate_batch", "rejected"]


@dataclass(frozen=True)
class IngestSummary:
    batch_sha256: str | None
    source: str
    status: Status
    rows_in: int
    rows_accepted: int
    rows_quarantined: int
    rows_duplicate: int
    part_file: str | None
    data_version: str | None
    report_json: str | None
    report_markdown: str | None
    message: str
    quarantine_file: str | None = None


def ingested_message(record: dict[str, Any]) -> str:
    extra = []
    if record["rows_quarantined"]:
        extra.append(f"{record['rows_quarantined']} quarantined")
    if record["rows_duplicate"]:
        extra.append(f"{record['rows_duplicate']} duplicates dropped")
    tail = f"; {', '.join(extra)}" if extra else ""
    return f"ingested {record['rows_accepted']} rows (data version {record['data_version']}){tail}"


def without_source(source: str, message: str) -> str:
    """Callers print a summary's source beside its message: the message says it once, not twice."""
    return message[len(source) + 2:] if message.startswith(f"{source}: ") else message


def rejected(
    sha: str | None,
    source: str,
    message: str,
    report_json: Path | None,
    report_md: Path | None,
    details: dict[str, Any] | None = None,
) -> IngestSummary:
    details = details or {}
    message = without_source(source, message)
    return IngestSummary(
        sha,
        source,
        "rejected",
        int(details.get("rows_in", 0)),
        0,
        0,
        0,
        None,
        None,
        str(report_json) if report_json else None,
        str(report_md) if report_md else None,
        message,
    )


def write_final_report(entry: dict[str, Any], version: str | None) -> None:
    report = dict(entry["report"], data_version=version, status="ingested")
    report["message"] = ingested_message(dict(entry["record"], data_version=version))
    validation.write_report(report, Path(entry["report_json"]), Path(entry["report_markdown"]))


def group_reasons(reasons: pd.Series) -> dict[str, int]:
    """Reason counts with the offending value stripped (so that they group)."""
    if reasons.empty:
        return {}
    parts = reasons.str.split("; ").explode()
    labels = parts.str.replace(r":\s.*$", "", regex=True)
    return {str(k): int(v) for k, v in labels.value_counts().head(20).items()}


def iso(seconds: float) -> str:
    return pd.Timestamp(seconds, unit="s", tz="UTC").isoformat()
