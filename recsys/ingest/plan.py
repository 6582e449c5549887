"""Planning a batch: everything up to the commit, with no side effects.

Schema check, canonical types, whole-batch validation, per-row quarantine reasons, and deduplication within
the batch and against the store. A bad batch raises `BatchRejected`; a good one gives a `Plan`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from recsys import validation
from recsys.config import IngestConfig
from recsys.ingest.canonical import CANONICAL, KEY, to_canonical
from recsys.ingest.errors import BatchRejected
from recsys.ingest.keys import KeyIndex
from recsys.ingest.layout import Paths
from recsys.ingest.read import read_batch
from recsys.ingest.report import group_reasons
from recsys.schema import ITEM, TIMESTAMP, USER



def dedup_within(frame: pd.DataFrame) -> np.ndarray:
    """Mask of rows to drop so that each (user, item, timestamp) key appears once.

    The survivor of a group is chosen by content (smallest rating, then event), not by position, so the
    kept rows do not depend on the batch's row order. Survivors keep their original relative order.
    """
    has_dup = frame.duplicated(subset=KEY, keep=False).to_numpy()
    drop = np.zeros(len(frame), dtype=bool)
    if not has_dup.any():
        return drop
    sub = frame.loc[has_dup, CANONICAL]
    ordered = sub.sort_values(CANONICAL, kind="stable", na_position="last")
    loser_labels = ordered.index[ordered.duplicated(subset=KEY, keep="first").to_numpy()]
    drop[frame.index.get_indexer(loser_labels)] = True
    return drop


@dataclass
class Plan:
    rows_in: int
    accepted: pd.DataFrame
    quarantined: pd.DataFrame  # raw (mapped) rows + reason
    rows_duplicate: int
    reasons: dict[str, int]
    validations: list[validation.SuiteResult]


def plan(path: Path, where: Paths, config: IngestConfig, index: KeyIndex) -> Plan:
    """Everything up to the commit, with no side effects (the index is only read); raises BatchRejected."""
    raw = read_batch(path, config)
    now = int(time.time())
    parameters = validation.suite_parameters(config, now, has_history=index.has_events())
    schema = validation.run_suite(validation.SCHEMA_SUITE, raw, parameters)
    if not schema.success:
        raise BatchRejected(_schema_message(path.name, schema, raw), [schema], rows_in=len(raw))

    typed = to_canonical(raw)
    # Seen users/items and stored event keys come from the key index: O(batch), whatever the store's size.
    typed[validation.UNSEEN_USER] = (typed[USER].notna() & ~index.known("users", typed[USER])).astype(np.int8)
    typed[validation.UNSEEN_ITEM] = (typed[ITEM].notna() & ~index.known("items", typed[ITEM])).astype(np.int8)
    batch = validation.run_suite(validation.BATCH_SUITE, typed, parameters)
    reasons = validation.row_failures(typed, parameters)
    bad = (reasons != "").to_numpy()
    counts = group_reasons(reasons[bad])
    bad_share = float(bad.mean()) if len(bad) else 0.0
    # Decided on counts, with GX's own test of `mostly` (bad_rows_allowed): a batch with exactly
    # ingest.max_bad_row_share bad rows is accepted, by GX and here alike.
    allowed = bad_rows_allowed(len(raw), parameters["min_good_row_share"])
    details = {"rows_in": len(raw), "rows_bad": int(bad.sum()), "rows_bad_allowed": allowed,
               "bad_row_share": bad_share, "reasons": counts}
    if not batch.success or int(bad.sum()) > allowed:
        raise BatchRejected(_batch_message(path.name, batch, details, config), [schema, batch], **details)

    good = typed.loc[~bad, list(CANONICAL)].astype({TIMESTAMP: "int64"})
    within = dedup_within(good)
    against = index.seen(good) & ~within
    accepted = good.loc[~(within | against)].reset_index(drop=True)
    store_check = validation.run_suite(validation.STORE_SUITE, accepted, parameters)
    if not store_check.success:
        failed = "; ".join(o.describe() for o in store_check.failures)
        raise BatchRejected(
            f"{path.name}: rows to append fail the store suite (a bug in row filtering): {failed}",
            [schema, batch, store_check],
            **details,
        )
    quarantined = raw.loc[bad].copy()
    quarantined["reason"] = reasons[bad].to_numpy()
    return Plan(
        len(raw),
        accepted,
        quarantined,
        int(within.sum() + against.sum()),
        counts,
        [schema, batch, store_check],
    )


def _batch_message(
    source: str, batch: validation.SuiteResult, details: dict[str, Any], config: IngestConfig
) -> str:
    rows, bad, allowed = details["rows_in"], details["rows_bad"], details["rows_bad_allowed"]
    if rows < config.min_rows:
        return (f"{source}: batch rejected: it has {rows} data row{'' if rows == 1 else 's'}, at least "
                f"{config.min_rows} required (ingest.min_rows; lower it to accept smaller batches)")
    parts = []
    top = ", ".join(f"{n} × {reason}" for reason, n in list(details["reasons"].items())[:3])
    # Counts, not rounded percentages: 1001 of 20000 and a limit of 0.05 both read "5.0%".
    if bad > allowed:
        # Every row failing is no share to raise: the rows, or the setting their reason names, are wrong.
        advice = "raise it, or fix the rows" if bad < rows else "fix the rows, or the setting their reason names"
        parts.append(
            f"{bad} of {rows} rows fail row checks, more than the {allowed} that ingest.max_bad_row_share "
            f"= {config.max_bad_row_share} allows ({advice}): {top}{_time_settings(details['reasons'], config)}"
        )
    else:
        # Within the limit over all rows, yet a row rule failed: GX counts only the rows where its column is
        # set (an event rule skips the rows without an event), so its share can be larger.
        parts += [_row_rule_failure(o, config) for o in batch.failures if o.unexpected_count is not None]
    # Row-rule failures are summarised by the reason counts above; table-level ones get their sentence.
    parts += [_table_failure(o, config) for o in batch.failures if o.unexpected_count is None]
    return f"{source}: batch rejected: " + "; ".join(parts)


TIME_RANGE_REASON = "timestamp before the configured floor or too far in the future"  # the suite's note


def _time_settings(reasons: dict[str, int], config: IngestConfig) -> str:
    """The settings behind the time-range reason, where it is among the reasons: which bound a row broke is
    not in the reason, and times in milliseconds (or microseconds) break the upper one."""
    if not any(TIME_RANGE_REASON in reason for reason in reasons):
        return ""
    return (f" (ingest.timestamp_floor = {config.timestamp_floor}, ingest.max_future_skew_seconds = "
            f"{config.max_future_skew_seconds}; a time in milliseconds lands in the future)")


def _row_rule_failure(outcome: validation.ExpectationOutcome, config: IngestConfig) -> str:
    considered = (outcome.element_count or 0) - (outcome.missing_count or 0)
    allowed = bad_rows_allowed(considered, float(outcome.kwargs.get("mostly", 1.0)))
    what = outcome.notes or outcome.expectation
    return (f"{outcome.unexpected_count} of the {considered} rows whose {outcome.column} is set fail the "
            f"check '{what}', more than the {allowed} that ingest.max_bad_row_share = "
            f"{config.max_bad_row_share} allows of them (rows whose {outcome.column} is empty are not "
            "counted)")


# The table-level expectations of the batch suite whose bound is a setting: the sentence for each.
_SHARES = {validation.UNSEEN_USER: ("users", "max_unseen_user_share"),
           validation.UNSEEN_ITEM: ("items", "max_unseen_item_share")}


def _table_failure(outcome: validation.ExpectationOutcome, config: IngestConfig) -> str:
    """A failed table-level expectation as a sentence naming the setting (the suite's own wording, with its
    numbers, for one this does not know)."""
    if outcome.column in _SHARES and isinstance(outcome.observed, (int, float)):
        what, setting = _SHARES[outcome.column]
        return (f"{float(outcome.observed):.1%} of its events name {what} the store has never seen "
                f"(limit ingest.{setting} = {getattr(config, setting)}; raise it if that many new {what} "
                "are expected)")
    return outcome.describe()


def _schema_message(source: str, schema: validation.SuiteResult, raw: pd.DataFrame) -> str:
    problems = []
    missing: set[str] = set()
    for outcome in schema.failures:
        if outcome.expectation == "expect_table_columns_to_match_set":
            observed = outcome.observed if isinstance(outcome.observed, dict) else {}
            missing |= set(observed.get("mismatched", {}).get("missing") or [])
    for outcome in schema.failures:
        if outcome.expectation != "expect_table_columns_to_match_set" and outcome.column in missing:
            continue  # a missing column has no type: "missing column(s)" already says it
        if outcome.expectation == "expect_table_columns_to_match_set":
            observed = outcome.observed if isinstance(outcome.observed, dict) else {}
            mismatched = observed.get("mismatched", {})
            if mismatched.get("missing"):
                problems.append(f"missing column(s) {sorted(mismatched['missing'])}")
            if mismatched.get("unexpected"):
                problems.append(f"unexpected column(s) {sorted(mismatched['unexpected'])}")
        else:
            problems.append(
                f"column {outcome.column!r} has type {_type_of(outcome, raw)}, expected one of "
                f"{outcome.kwargs.get('type_list')}"
            )
    hint = (
        " (rename them with ingest.column_mapping, or set ingest.extra_columns: drop)"
        if any("column(s)" in p for p in problems)
        else ""
    )
    return f"{source}: wrong schema: {'; '.join(problems) or 'see report'}{hint}"


def _type_of(outcome: validation.ExpectationOutcome, raw: pd.DataFrame) -> str:
    """The type GX observed; for a column of Python objects, which GX calls "None", the type of its values
    (decimal.Decimal from a Parquet decimal column, say)."""
    if outcome.observed is not None or outcome.column not in raw.columns:
        return str(outcome.observed)
    values = raw[outcome.column].dropna()
    kinds = sorted({f"{type(v).__module__}.{type(v).__qualname__}".removeprefix("builtins.")
                    for v in values[:100]})
    return f"object (values of type {', '.join(kinds) or 'none'})"


def passes_mostly(rows: int, bad: int, mostly: float) -> bool:
    """GX's own test of a column-map expectation's `mostly` (an empty column passes)."""
    return rows == 0 or (float(rows) - float(bad)) / float(rows) >= mostly


def bad_rows_allowed(rows: int, mostly: float) -> int:
    """The most of `rows` rows that may fail a row check with the batch still accepted: the count at which
    `passes_mostly` (GX's test) turns, so the verdict and the message's numbers agree."""
    allowed = min(rows, max(0, int((1.0 - mostly) * rows)))
    while allowed < rows and passes_mostly(rows, allowed + 1, mostly):
        allowed += 1
    while allowed > 0 and not passes_mostly(rows, allowed, mostly):
        allowed -= 1
    return allowed
