import errno

import pandas as pd
import pyarrow.parquet as pq
import pytest

from recsys import store
from recsys.schema import ARROW_SCHEMA


def frame(users, ts):
    return pd.DataFrame({"user_id": users, "item_id": ["i"] * len(users), "timestamp": ts})


def test_empty_store_reads_as_empty_canonical_frame(tmp_path):
    out = store.read_store(tmp_path / "missing")
    assert list(out.columns) == ARROW_SCHEMA.names
    assert len(out) == 0
    assert out["timestamp"].dtype == "int64"


def test_parts_are_read_in_file_name_order_then_row_order(tmp_path):
    store.write_part(tmp_path, "part-b.parquet", frame(["b1", "b2"], [5, 1]))
    store.write_part(tmp_path, "part-0seed.parquet", frame(["s1", "s2"], [9, 8]))
    store.write_part(tmp_path, "part-a.parquet", frame(["a1"], [3]))
    out = store.read_store(tmp_path)
    assert out["user_id"].tolist() == ["s1", "s2", "a1", "b1", "b2"]
    assert out["rating"].isna().all()  # optional columns come back as nulls
    assert store.read_store(tmp_path, columns=["user_id", "timestamp"]).columns.tolist() == [
        "user_id",
        "timestamp",
    ]


def test_write_part_has_canonical_schema_and_refuses_to_overwrite(tmp_path):
    path = store.write_part(tmp_path, "part-x.parquet", frame(["u"], [1]))
    assert pq.read_schema(path).names == ARROW_SCHEMA.names
    before = path.read_bytes()
    with pytest.raises(store.StoreError, match="already exists"):
        store.write_part(tmp_path, "part-x.parquet", frame(["v"], [2]))
    assert path.read_bytes() == before


def test_failed_write_leaves_no_part_and_no_temp_file(tmp_path, monkeypatch):
    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store.pq, "write_table", disk_full)
    with pytest.raises(OSError, match="No space"):
        store.write_part(tmp_path, "part-x.parquet", frame(["u"], [1]))
    assert list(store.interactions_dir(tmp_path).iterdir()) == []


def test_stale_temp_files_are_ignored_and_cleaned(tmp_path):
    store.write_part(tmp_path, "part-a.parquet", frame(["a"], [1]))
    stale = store.interactions_dir(tmp_path) / ".tmp-123.parquet"
    stale.write_bytes(b"half a parquet file")
    assert store.read_store(tmp_path)["user_id"].tolist() == ["a"]
    assert store.remove_stale_temp_files(tmp_path) == [stale]
    assert not stale.exists()


def test_unreadable_part_is_a_clear_error(tmp_path):
    store.interactions_dir(tmp_path).mkdir(parents=True)
    (store.interactions_dir(tmp_path) / "part-bad.parquet").write_bytes(b"PAR1garbage")
    with pytest.raises(store.StoreError, match=r"cannot read store part .*part-bad.parquet \(.+\); put the data "
                                                r"version back with `dvc checkout data.dvc` \(or `dvc pull "
                                                r"data.dvc`\), then run again$") as raised:
        store.read_store(tmp_path)
    # One line from every entry point (`recsys prepare`, `dvc repro prepare`), and never retried by a flow:
    # it was neither, a traceback ending in StoreError.
    from recsys.entry import is_transient, is_user_error

    assert is_user_error(raised.value) and not is_transient(raised.value)
