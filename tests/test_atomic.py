"""All-or-nothing writes (recsys/atomic.py) and the writers that use them: a failure leaves the old file or
folder whole and nothing of the attempt behind."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pytest

from recsys.atomic import atomic_path, remove_stale_temp_dirs, replace_dir, write_text_atomic


def test_atomic_path_replaces_on_success_and_leaves_the_old_file_on_failure(tmp_path):
    target = tmp_path / "per_user.parquet"
    with atomic_path(target, tmp_path) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".per_user.parquet.")
        pd.DataFrame({"user": [1, 2]}).to_parquet(tmp, index=False)
    assert pd.read_parquet(target)["user"].tolist() == [1, 2]
    with pytest.raises(ZeroDivisionError):
        with atomic_path(target, tmp_path) as tmp:
            pd.DataFrame({"user": [3]}).to_parquet(tmp, index=False)
            1 / 0
    assert pd.read_parquet(target)["user"].tolist() == [1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["per_user.parquet"]


def test_two_writes_of_one_name_in_one_process_never_share_a_temp_file(tmp_path):
    """Prefect's thread task runner can run two writers of one file name in one process at once."""
    with atomic_path(tmp_path / "report.json", tmp_path) as first, \
            atomic_path(tmp_path / "report.json", tmp_path) as second:
        assert first != second
        first.write_text("1")
        second.write_text("2")
    assert (tmp_path / "report.json").read_text() == "1"  # the outer block ended last
    write_text_atomic(tmp_path / "report.json", "3", tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_replace_dir_puts_the_old_folder_back_when_the_new_one_cannot_take_its_place(tmp_path):
    out = tmp_path / "prepared"
    out.mkdir()
    (out / "fingerprint.json").write_text("old")
    missing = tmp_path / ".prepared-gone"  # the rename of the new copy fails: it is not there
    with pytest.raises(FileNotFoundError):
        replace_dir(missing, out)
    assert (out / "fingerprint.json").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["prepared"]


def test_a_save_killed_between_the_two_renames_gets_the_previous_copy_back(tmp_path):
    """The kill left `.prepared-old` (the previous copy) and the new temp copy, and no `prepared`: the next
    save's cleanup puts the old one back before it removes the rest."""
    old, temp = tmp_path / ".prepared-old", tmp_path / ".prepared-1a2b3c4d"
    for folder in (old, temp):
        folder.mkdir()
        (folder / "fingerprint.json").write_text(folder.name)
    assert remove_stale_temp_dirs(tmp_path / "prepared") == [temp]
    assert (tmp_path / "prepared" / "fingerprint.json").read_text() == ".prepared-old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prepared"]


def test_a_prepared_dataset_that_fails_to_save_leaves_the_previous_one_whole(tmp_path, tiny_prepared):
    """It was written in place, its fingerprint (the mark of a complete folder) last: a failure part-way left
    the old fingerprint over new tables. Now the new dataset is a sibling folder renamed into place."""
    import dataclasses

    from recsys.prepare import load, save

    out = tmp_path / "prepared"
    save(tiny_prepared, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    unstorable = [object()] * len(tiny_prepared.users)  # pyarrow refuses it: the third of the three tables
    broken = dataclasses.replace(tiny_prepared, events=tiny_prepared.events.iloc[:-1],  # new events, written first
                                 users=tiny_prepared.users.assign(bad=unstorable))
    with pytest.raises(pa.ArrowInvalid, match="convert"):
        save(broken, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["prepared"]
    assert json.loads((out / "fingerprint.json").read_text()) == tiny_prepared.fingerprint
    assert load(out).events.equals(tiny_prepared.events)


def test_a_file_where_an_output_folder_goes_is_refused_and_kept(tmp_path, tiny_prepared):
    """A save renamed whatever stood at `out` aside and deleted it: a file there (or where a folder above it
    goes) is now refused with one line, and stays as it was."""
    from recsys.atomic import NotAFolderError
    from recsys.entry import is_user_error
    from recsys.prepare import save

    precious = tmp_path / "prepared"
    precious.write_text("precious")
    with pytest.raises(NotAFolderError, match=f"{precious} is a file where the output folder goes") as err:
        save(tiny_prepared, precious)
    assert is_user_error(err.value)
    with pytest.raises(NotAFolderError, match="a folder above"):
        save(tiny_prepared, precious / "inner")
    assert precious.read_text() == "precious"
    assert [p.name for p in tmp_path.iterdir()] == ["prepared"]
