"""One canonical form for every input path: ingest, `recsys data import table`, the readers.

The cases that used to differ: an integer id held as a float in Parquet (a null elsewhere in the column
makes pandas write floats) became "7.0" on the import path and "7" on the ingest path, and a missing event
became the string "nan" on the import path — one user silently split in two.
"""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from recsys import data, schema
from recsys.cli import app as cli_app
from recsys.ingest import ingest_batches, to_canonical
from recsys.store import read_store
from test_ingest_support import T0, config, make_repo


def float_id_parquet(path):
    """Ids 7 and 8 stored as doubles, one event missing: what a pandas frame with a null writes."""
    table = pa.table(
        {
            "customer": pa.array([7.0, 8.0, 7.0], pa.float64()),
            "sku": pa.array([100.0, 101.0, 102.0], pa.float64()),
            "ts": pa.array([T0, T0 + 1, T0 + 2], pa.int64()),
            "kind": pa.array(["view", None, "click"], pa.string()),
        }
    )
    pq.write_table(table, path)
    return path


MAPPING = {schema.USER: "customer", schema.ITEM: "sku", schema.TIMESTAMP: "ts", schema.EVENT: "kind"}
EXPECTED_USERS = ["7", "8", "7"]
EXPECTED_ITEMS = ["100", "101", "102"]


def assert_canonical(frame):
    assert frame[schema.USER].tolist() == EXPECTED_USERS
    assert frame[schema.ITEM].tolist() == EXPECTED_ITEMS
    assert frame[schema.TIMESTAMP].tolist() == [T0, T0 + 1, T0 + 2]
    events = frame[schema.EVENT].tolist()
    assert events[0] == "view" and events[2] == "click"
    assert pd.isna(events[1]), f"a missing event must stay missing, got {events[1]!r}"


def test_to_canonical_owns_ids_events_and_timestamps():
    raw = pd.DataFrame(
        {
            schema.USER: pd.Series([7.0, None, 9.0]),
            schema.ITEM: pd.Series(["a", " ", "007"], dtype="string"),
            schema.TIMESTAMP: pd.Series([str(T0), "2023-11-14T22:13:20Z", "yesterday"], dtype="string"),
            schema.RATING: pd.Series([1.0, None, 2.0]),
            schema.EVENT: pd.Series(["view", None, float("nan")], dtype=object),
        }
    )
    typed = to_canonical(raw)
    assert typed[schema.USER].tolist()[0] == "7" and pd.isna(typed[schema.USER].iloc[1])
    assert typed[schema.ITEM].tolist()[2] == "007" and pd.isna(typed[schema.ITEM].iloc[1])  # blank = missing
    assert typed[schema.TIMESTAMP].tolist()[:2] == [T0, T0]  # epoch seconds and ISO-8601 agree
    assert pd.isna(typed[schema.TIMESTAMP].iloc[2])
    assert "timestamp is neither UTC seconds nor ISO-8601: yesterday" == typed["_parse_error"].iloc[2]
    assert typed[schema.EVENT].isna().tolist() == [False, True, True]


def test_data_canonical_is_the_same_function():
    frame = pd.DataFrame({schema.USER: [7.0], schema.ITEM: [1], schema.TIMESTAMP: [T0], schema.EVENT: [None]})
    out = data.canonical(frame)
    assert out[schema.USER].tolist() == ["7"] and out[schema.ITEM].tolist() == ["1"]
    assert out[schema.EVENT].isna().all()
    with pytest.raises(data.DataError, match="1 of 1 rows have an unusable value, e.g. row 1: timestamp"):
        data.canonical(frame.assign(timestamp=["yesterday"]))


@pytest.mark.slow  # over 2 s on an idle 2-core box (a process start): with the slow tests
def test_float_ids_and_missing_event_through_the_ingest_path(tmp_path):
    repo = make_repo(tmp_path / "repo")
    path = float_id_parquet(repo / "inbox" / "batch.parquet")
    [summary] = ingest_batches([path], repo, config(column_mapping=MAPPING))
    assert summary.status == "ingested", summary.message
    assert_canonical(read_store(repo / "data"))


def test_float_ids_and_missing_event_through_data_import_table(tmp_path):
    path = float_id_parquet(tmp_path / "table.parquet")
    assert_canonical(data.read_table(path, MAPPING))
    out = tmp_path / "store"
    columns = [f"--column={canonical}={source}" for canonical, source in MAPPING.items()]
    result = CliRunner().invoke(cli_app, ["data", "import", "table", str(path), "--out", str(out), *columns])
    assert result.exit_code == 0, result.output
    assert_canonical(read_store(out))


@pytest.mark.parametrize("suffix,times", [(".csv", "epoch"), (".jsonl", "epoch"), (".csv", "iso"),
                                          (".jsonl", "iso")])
def test_import_and_ingest_agree_on_text_formats(tmp_path, suffix, times):
    """Epoch seconds or ISO-8601 strings (which pyarrow's JSON reader turns into timestamps by itself)."""
    ts = [T0, T0 + 1, T0 + 2]
    frame = pd.DataFrame(
        {
            "customer": [7, 8, 7],
            "sku": [100, 101, 102],
            "ts": ts if times == "epoch" else pd.to_datetime(ts, unit="s", utc=True).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "kind": ["view", None, "click"],
        }
    )
    repo = make_repo(tmp_path / "repo")
    path = repo / "inbox" / f"batch{suffix}"
    if suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_json(path, orient="records", lines=True)
    imported = data.read_table(path, MAPPING)
    assert_canonical(imported)
    [summary] = ingest_batches([path], repo, config(column_mapping=MAPPING))
    assert summary.status == "ingested", summary.message
    pd.testing.assert_frame_equal(read_store(repo / "data"), read_store_like(imported))


def read_store_like(frame):
    """A frame as it reads back from the store (Arrow round trip), for an exact comparison."""
    from recsys.store import to_arrow

    return to_arrow(frame).to_pandas()


def test_a_user_imported_from_float_ids_is_the_same_user_when_ingested_later(tmp_path):
    """The split-user bug end to end: seed from Parquet doubles, then a CSV batch with the same user."""
    repo = make_repo(tmp_path / "repo")
    result = CliRunner().invoke(
        cli_app,
        ["data", "import", "table", str(float_id_parquet(tmp_path / "seed.parquet")), "--out",
         str(repo / "data"), *[f"--column={c}={s}" for c, s in MAPPING.items()]],
    )
    assert result.exit_code == 0, result.output
    batch = repo / "inbox" / "later.csv"
    batch.write_text(f"user_id,item_id,timestamp,event\n7,100,{T0 + 50},view\n")
    [summary] = ingest_batches([batch], repo, config(max_unseen_user_share=0.0, max_unseen_item_share=0.0))
    assert summary.status == "ingested", summary.message  # user 7 and item 100 are known: none unseen
    assert sorted(read_store(repo / "data")[schema.USER].unique()) == ["7", "8"]
