"""Great Expectations (1.x) suites for incoming interaction batches, plus the per-row view of the same rules.

The suites live as JSON in `expectations/` and are the single source of truth (one file over 400 lines on
purpose: running a suite and its per-row view must read the same expectations the same way):

- `interactions_schema` — on the batch as read and column-mapped: exact canonical column set, reader dtypes.
  A failure rejects the batch whole.
- `interactions_batch` — on the whole typed batch: minimum row count, per-row rules with a tolerance
  (`mostly`), bounds on the share of unseen users/items. A failure rejects the batch whole.
- `interactions_store` — on exactly the rows about to be appended: the same per-row rules with no tolerance,
  canonical dtypes and a unique (user_id, item_id, timestamp) key.

Thresholds from `params.yaml` are written in the JSON as GX suite parameters, `{"$PARAMETER": "name"}`,
and filled in at run time through GX's own `expectation_parameters` (see `suite_parameters`); the JSON
never has to be edited when a param changes.

Per-row quarantine reasons come from `row_failures`, which evaluates the same JSON expectations (those
marked `"row_check": true`) with vectorised pandas, because the quarantine file needs every failing row and
GX only reports a sample of them. The accept/reject verdict is always GX's; tests check that both views
count the same failures.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from recsys.atomic import write_text_atomic
from recsys.config import PROJECT_ROOT, IngestConfig
from recsys.layout import EXPECTATIONS

log = logging.getLogger(__name__)

SUITES_DIR = PROJECT_ROOT / EXPECTATIONS
SCHEMA_SUITE = "interactions_schema"
BATCH_SUITE = "interactions_batch"
STORE_SUITE = "interactions_store"

PARSE_ERROR = "_parse_error"
UNSEEN_USER = "_unseen_user"
UNSEEN_ITEM = "_unseen_item"


class ValidationSetupError(RuntimeError):
    """A suite file is missing or malformed (a bug in the repo, not in the batch)."""


# --------------------------------------------------------------------------------------------- suites


def load_suite_json(name: str, suites_dir: Path | None = None) -> dict[str, Any]:
    path = Path(suites_dir or SUITES_DIR) / f"{name}.json"
    try:
        suite = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise ValidationSetupError(f"expectation suite not found: {path}") from err
    except json.JSONDecodeError as err:
        raise ValidationSetupError(f"expectation suite {path} is not valid JSON: {err}") from err
    if suite.get("name") != name or not isinstance(suite.get("expectations"), list):
        raise ValidationSetupError(f"{path}: expected {{'name': {name!r}, 'expectations': [...]}}")
    return suite


def suite_parameters(config: IngestConfig, now: int, has_history: bool) -> dict[str, Any]:
    """Values for the `$PARAMETER` placeholders of the suites, from `params.yaml` `ingest`.

    While the store is empty every user and item is unseen, so the unseen-share bounds are not applied.
    """
    return {
        "min_rows": int(config.min_rows),
        "min_good_row_share": min_good_row_share(config),
        "timestamp_floor": int(config.timestamp_floor),
        "timestamp_ceiling": int(now) + int(config.max_future_skew_seconds),
        "allowed_events": list(config.allowed_events),
        "max_unseen_user_share": float(config.max_unseen_user_share) if has_history else 1.0,
        "max_unseen_item_share": float(config.max_unseen_item_share) if has_history else 1.0,
    }


# GX's `mostly` compares float ratios, `(rows - bad) / rows >= mostly`: with mostly = 1 - 0.18 (which is
# 0.8200000000000001) a batch of 50 with 9 bad rows, exactly at the limit, failed (41/50 is 0.82). This slack
# absorbs such float error and is far below one row's share of any batch (under a trillion rows).
_SHARE_SLACK = 1e-12


def min_good_row_share(config: IngestConfig) -> float:
    """GX's `mostly` for the row checks: a batch with exactly `ingest.max_bad_row_share` bad rows passes."""
    return max(0.0, 1.0 - float(config.max_bad_row_share) - _SHARE_SLACK)


def resolve(value: Any, parameters: dict[str, Any]) -> Any:
    """Replace `{"$PARAMETER": name}` (recursively) the way GX does at run time."""
    if isinstance(value, dict):
        if set(value) == {"$PARAMETER"}:
            name = value["$PARAMETER"]
            if name not in parameters:
                raise ValidationSetupError(f"suite parameter {name!r} has no value")
            return parameters[name]
        return {k: resolve(v, parameters) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, parameters) for v in value]
    return value


# ------------------------------------------------------------------------------------------ GX runtime

_lock = threading.Lock()
_runtime: dict[str, Any] = {}


def _gx_context() -> Any:
    """One ephemeral GX context per process (GX takes seconds to import and start)."""
    with _lock:
        if "context" not in _runtime:
            os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
            import great_expectations as gx
            from great_expectations.data_context.types.base import ProgressBarsConfig

            # Its creation announces, at INFO, a temp folder for a docs site this system never builds: a
            # flow's console (`flows.errors.run_main` logs at INFO) would show it on every ingest.
            logging.getLogger("great_expectations.data_context.types.base").setLevel(logging.WARNING)
            context = gx.get_context(mode="ephemeral")
            context.variables.progress_bars = ProgressBarsConfig(globally=False)
            source = context.data_sources.add_pandas("ingest")
            asset = source.add_dataframe_asset("batch")
            _runtime["gx"] = gx
            _runtime["context"] = context
            _runtime["batch_definition"] = asset.add_batch_definition_whole_dataframe("whole")
            _runtime["definitions"] = {}
        return _runtime["context"]


def _validation_definition(name: str, suites_dir: Path | None) -> Any:
    context = _gx_context()
    key = (name, str(Path(suites_dir or SUITES_DIR).resolve()))
    with _lock:
        definitions = _runtime["definitions"]
        if key not in definitions:
            gx = _runtime["gx"]
            raw = load_suite_json(name, suites_dir)
            unique = f"{name}_{len(definitions)}"
            try:
                suite = gx.ExpectationSuite(
                    name=unique, expectations=raw["expectations"], meta=raw.get("meta") or {}
                )
            except Exception as err:  # GX raises several types for a malformed expectation
                raise ValidationSetupError(f"expectation suite {name!r} is invalid: {err}") from err
            suite = context.suites.add(suite)
            definitions[key] = context.validation_definitions.add(
                gx.ValidationDefinition(name=unique, data=_runtime["batch_definition"], suite=suite)
            )
        return definitions[key]


@dataclass(frozen=True)
class ExpectationOutcome:
    expectation: str
    column: str | None
    success: bool
    kwargs: dict[str, Any]
    observed: Any
    unexpected_count: int | None
    element_count: int | None
    notes: str
    sample: list[Any] = field(default_factory=list)
    missing_count: int | None = None  # rows a column-map expectation skipped (null): not in its `mostly`

    def describe(self) -> str:
        target = f"{self.expectation}({self.column})" if self.column else self.expectation
        args = {k: v for k, v in self.kwargs.items() if k not in ("column", "batch_id", "column_list")}
        text = f"{target} {json.dumps(args, default=str)}"
        if self.unexpected_count is not None:
            text += f": {self.unexpected_count} of {self.element_count} rows unexpected"
            if self.sample:
                text += f", e.g. {[_short(v) for v in self.sample[:3]]}"
        elif self.observed is not None:
            text += f": observed {_short(self.observed)}"
        if self.notes:
            text += f" — {self.notes}"
        return text


@dataclass(frozen=True)
class SuiteResult:
    suite: str
    success: bool
    outcomes: tuple[ExpectationOutcome, ...]
    parameters: dict[str, Any]

    @property
    def failures(self) -> list[ExpectationOutcome]:
        return [o for o in self.outcomes if not o.success]

    def to_dict(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "success": self.success,
            "statistics": {
                "evaluated": len(self.outcomes),
                "successful": sum(o.success for o in self.outcomes),
                "unsuccessful": len(self.failures),
            },
            "results": [
                {
                    "expectation": o.expectation,
                    "column": o.column,
                    "success": o.success,
                    "kwargs": _jsonable(o.kwargs),
                    "observed": _jsonable(o.observed),
                    "unexpected_count": o.unexpected_count,
                    "element_count": o.element_count,
                    "sample": _jsonable(o.sample[:5]),
                    "notes": o.notes,
                }
                for o in self.outcomes
            ],
        }


def gx_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """GX compares dtypes exactly and pandas 3's default `str` dtype is not one it recognises, so
    string-like columns are given the `string` (StringDtype) dtype. Cheap: both are Arrow-backed."""
    out = {}
    for name in frame.columns:
        col = frame[name]
        is_other_string = isinstance(col.dtype, pd.StringDtype) and col.dtype != pd.StringDtype()
        out[name] = col.astype("string") if is_other_string else col
    return pd.DataFrame(out, index=frame.index)


def run_suite(
    name: str, frame: pd.DataFrame, parameters: dict[str, Any], suites_dir: Path | None = None
) -> SuiteResult:
    """Validate `frame` with the GX suite `name`. A failed validation is a result, not an exception."""
    definition = _validation_definition(name, suites_dir)
    raw = load_suite_json(name, suites_dir)
    notes_by_index = [(e.get("meta") or {}).get("notes", "") for e in raw["expectations"]]
    result = definition.run(
        batch_parameters={"dataframe": gx_frame(frame)},
        expectation_parameters=parameters,
        result_format="SUMMARY",
    )
    # GX reorders results; match notes back by (type, kwargs without batch_id).
    notes_by_key = {}
    for expectation, notes in zip(raw["expectations"], notes_by_index, strict=True):
        key = (
            expectation["type"],
            json.dumps(resolve(expectation["kwargs"], parameters), sort_keys=True, default=str),
        )
        notes_by_key[key] = notes
    outcomes = []
    for item in result.results:
        config = item.expectation_config
        kwargs = {k: v for k, v in dict(config.kwargs).items() if k != "batch_id"}
        res = dict(item.result or {})
        info = item.exception_info or {}
        if info.get("raised_exception"):
            res["observed_value"] = f"error: {info.get('exception_message')}"
        key = (config.type, json.dumps(kwargs, sort_keys=True, default=str))
        outcomes.append(
            ExpectationOutcome(
                expectation=config.type,
                column=kwargs.get("column")
                or (",".join(kwargs["column_list"]) if "column_list" in kwargs else None),
                success=bool(item.success),
                kwargs=kwargs,
                observed=_mismatch_details(res),
                unexpected_count=res.get("unexpected_count"),
                element_count=res.get("element_count"),
                notes=notes_by_key.get(key, ""),
                sample=list(res.get("partial_unexpected_list") or []),
                missing_count=res.get("missing_count"),
            )
        )
    return SuiteResult(
        suite=name, success=bool(result.success), outcomes=tuple(outcomes), parameters=parameters
    )


def _mismatch_details(res: dict[str, Any]) -> Any:
    observed = res.get("observed_value")
    details = (res.get("details") or {}).get("mismatched")
    if details:
        return {"observed": observed, "mismatched": details}
    return observed


# ---------------------------------------------------------------------------- per-row (vectorised) view


def row_failures(
    frame: pd.DataFrame, parameters: dict[str, Any], suites_dir: Path | None = None
) -> pd.Series:
    """Per row, the reasons (joined by '; ') it fails the row-level rules of `interactions_batch`.

    Rows that pass get an empty string. Column-map semantics follow GX: nulls are skipped by every rule
    except the null checks themselves.
    """
    raw = load_suite_json(BATCH_SUITE, suites_dir)
    reasons = pd.Series("", index=frame.index, dtype=object)
    for expectation in raw["expectations"]:
        meta = expectation.get("meta") or {}
        if not meta.get("row_check"):
            continue
        kwargs = resolve(expectation["kwargs"], parameters)
        column = kwargs["column"]
        bad = _unexpected_mask(expectation["type"], frame[column], kwargs)
        if expectation["type"] == "expect_column_values_to_not_be_null" and PARSE_ERROR in frame:
            # A value that failed conversion is null now, and its parse error (which starts with the
            # column's name) already says why: one reason per problem, not two.
            bad &= ~frame[PARSE_ERROR].fillna("").str.startswith(f"{column} ").to_numpy(dtype=bool)
        if not bad.any():
            continue
        label = meta.get("notes") or f"{expectation['type']}({column})"
        if column == PARSE_ERROR:
            text = frame.loc[bad, PARSE_ERROR].astype(str)
        else:
            text = pd.Series(label, index=frame.index[bad])
        reasons.loc[bad] = np.where(reasons.loc[bad] == "", text, reasons.loc[bad] + "; " + text)
    return reasons


def _unexpected_mask(kind: str, col: pd.Series, kwargs: dict[str, Any]) -> np.ndarray:
    present = col.notna().to_numpy()
    if kind == "expect_column_values_to_not_be_null":
        return ~present
    if kind == "expect_column_values_to_be_null":
        return present
    values = col[present]
    if kind == "expect_column_values_to_not_match_regex":
        hit = values.astype(str).str.contains(kwargs["regex"], regex=True).to_numpy(dtype=bool)
    elif kind == "expect_column_value_lengths_to_be_between":
        lengths = values.astype(str).str.len().to_numpy()
        hit = _outside(lengths, kwargs)
    elif kind == "expect_column_values_to_be_between":
        hit = _outside(values.to_numpy(dtype=float), kwargs)
    elif kind == "expect_column_values_to_be_in_set":
        hit = ~values.isin(list(kwargs["value_set"])).to_numpy(dtype=bool)
    else:
        raise ValidationSetupError(f"{kind} cannot be evaluated per row; remove its row_check flag")
    mask = np.zeros(len(col), dtype=bool)
    mask[present] = hit
    return mask


def _outside(values: np.ndarray, kwargs: dict[str, Any]) -> np.ndarray:
    bad = np.zeros(len(values), dtype=bool)
    if kwargs.get("min_value") is not None:
        bad |= values < kwargs["min_value"] if not kwargs.get("strict_min") else values <= kwargs["min_value"]
    if kwargs.get("max_value") is not None:
        bad |= values > kwargs["max_value"] if not kwargs.get("strict_max") else values >= kwargs["max_value"]
    return bad


# -------------------------------------------------------------------------------------------- reports


def write_report(report: dict[str, Any], json_path: Path, markdown_path: Path) -> None:
    """The full report as JSON and a short markdown summary (what the flow publishes)."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    # each replaced whole (the final report rewrites an earlier one that a flow's artifact may be reading)
    write_text_atomic(json_path, json.dumps(_jsonable(report), indent=2, sort_keys=False) + "\n", json_path.parent)
    write_text_atomic(markdown_path, render_markdown(report), markdown_path.parent)


def render_markdown(report: dict[str, Any]) -> str:
    status = report.get("status", "?")
    lines = [
        f"# Ingest report: {report.get('source', '?')}",
        "",
        f"**{status.upper()}** — {report.get('message', '')}",
        "",
        "| | |",
        "|---|---|",
    ]
    for key in (
        "batch_sha256",
        "rows_in",
        "rows_accepted",
        "rows_quarantined",
        "rows_duplicate",
        "part_file",
        "data_version",
        "quarantine_file",
    ):
        if report.get(key) is not None:
            lines.append(f"| {key} | {report[key]} |")
    for suite in report.get("validations", []):
        stats = suite["statistics"]
        verdict = "passed" if suite["success"] else "FAILED"
        lines += [
            "",
            f"## {suite['suite']}: {verdict} ({stats['successful']}/{stats['evaluated']} expectations)",
        ]
        for item in suite["results"]:
            if item["success"] and not item.get("unexpected_count"):
                continue
            mark = "✅" if item["success"] else "❌"
            what = f"`{item['expectation']}`" + (f" on `{item['column']}`" if item["column"] else "")
            detail = (
                f"{item['unexpected_count']} of {item['element_count']} rows"
                if item.get("unexpected_count") is not None
                else f"observed {_short(item['observed'])}"
            )
            notes = f" — {item['notes']}" if item.get("notes") else ""
            lines.append(f"- {mark} {what}: {detail}{notes}")
    if report.get("reasons"):
        lines += ["", "## Quarantine reasons", ""]
        lines += [f"- {count} × {reason}" for reason, count in report["reasons"].items()]
    return "\n".join(lines) + "\n"


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        return None if not np.isfinite(value) else float(value)
    if isinstance(value, (np.bool_,)):
        return bool(value)
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if value is pd.NA or value is pd.NaT:
        return None
    return str(value)
