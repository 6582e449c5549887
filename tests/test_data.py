"""Readers, the checksum-verified downloader and the deterministic generator (recsys/data.py)."""

from __future__ import annotations

import hashlib
import os
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from recsys import schema
from recsys.config import GenerateConfig
from recsys.data import (
    DataError,
    canonical,
    download,
    download_movielens,
    generate,
    read_movielens_1m,
    read_movielens_100k,
    read_movielens_titles,
    read_table,
    write_store,
    write_table,
)

CANONICAL_COLUMNS = [schema.USER, schema.ITEM, schema.TIMESTAMP, schema.RATING, schema.EVENT]


def assert_canonical_dtypes(frame: pd.DataFrame) -> None:
    assert list(frame.columns) == CANONICAL_COLUMNS
    assert frame[schema.TIMESTAMP].dtype == np.int64
    assert frame[schema.RATING].dtype == np.float32
    assert all(isinstance(v, str) for v in frame[schema.USER]) and all(isinstance(v, str) for v in frame[schema.ITEM])


# --- readers ------------------------------------------------------------------------------------------------


def test_read_movielens_1m(tmp_path):
    (tmp_path / "ratings.dat").write_text("1::1193::5::978300760\n1::661::3::978302109\n2::1193::4::978301968\n")
    for path in (tmp_path, tmp_path / "ratings.dat"):  # the folder or the file
        frame = read_movielens_1m(path)
        assert_canonical_dtypes(frame)
        assert frame[schema.USER].tolist() == ["1", "1", "2"]
        assert frame[schema.ITEM].tolist() == ["1193", "661", "1193"]
        assert frame[schema.TIMESTAMP].tolist() == [978300760, 978302109, 978301968]
        assert frame[schema.RATING].tolist() == [5.0, 3.0, 4.0]
        assert frame[schema.EVENT].tolist() == ["rating"] * 3


def test_read_movielens_100k(tmp_path):
    (tmp_path / "u.data").write_text("196\t242\t3\t881250949\n186\t302\t3\t891717742\n")
    frame = read_movielens_100k(tmp_path)
    assert_canonical_dtypes(frame)
    assert frame[[schema.USER, schema.ITEM, schema.TIMESTAMP]].values.tolist() == [
        ["196", "242", 881250949], ["186", "302", 891717742]]


def test_read_movielens_titles(tmp_path):
    movies = "1::Toy Story (1995)::Animation\n2::Amélie (2001)::Comedy\n"
    (tmp_path / "movies.dat").write_bytes(movies.encode("latin-1"))
    titles = read_movielens_titles(tmp_path)
    assert titles.values.tolist() == [["1", "Toy Story (1995)"], ["2", "Amélie (2001)"]]
    (tmp_path / "empty").mkdir()
    assert read_movielens_titles(tmp_path / "empty") is None


@pytest.mark.parametrize("content", ["1::1193::5\n", "1::1193::five::978300760\n", "1,1193,5,978300760\n"])
def test_read_movielens_1m_malformed(tmp_path, content):
    (tmp_path / "ratings.dat").write_text(content)
    with pytest.raises(DataError, match="ratings.dat.*MovieLens-1M"):
        read_movielens_1m(tmp_path)


def test_read_movielens_100k_malformed(tmp_path):
    (tmp_path / "u.data").write_text("196::242::3::881250949\n")
    with pytest.raises(DataError, match="u.data"):
        read_movielens_100k(tmp_path)


def test_missing_files_are_data_errors(tmp_path):
    with pytest.raises(DataError, match="not found"):
        read_movielens_1m(tmp_path)
    with pytest.raises(DataError, match="not found"):
        read_movielens_100k(tmp_path / "nope")
    with pytest.raises(DataError, match="not found"):
        read_table(tmp_path / "nope.csv")


def test_the_other_movielens_layout_is_named_where_its_file_is(tmp_path):
    """`data import movielens-1m` of an ml-100k folder said only that ratings.dat was not found."""
    (tmp_path / "u.data").write_text("196\t242\t3\t881250949\n")
    with pytest.raises(DataError, match=r"ratings.dat not found \(.* holds u.data: import it as movielens-100k\)$"):
        read_movielens_1m(tmp_path)
    (tmp_path / "u.data").unlink()
    (tmp_path / "ratings.dat").write_text("1::2::3::978300760\n")
    with pytest.raises(DataError, match=r"u.data not found \(.* holds ratings.dat: import it as movielens-1m\)$"):
        read_movielens_100k(tmp_path)


def test_read_csv_with_column_mapping(tmp_path):
    path = tmp_path / "events.csv"
    path.write_text("uid,sku,ts,kind\nA7,sku-1,1700000000,click\n007,42,1700000100,cart\n")
    frame = read_table(path, {schema.USER: "uid", schema.ITEM: "sku", schema.TIMESTAMP: "ts",
                              schema.EVENT: "kind"})
    assert_canonical_dtypes(frame)
    # Ids stay strings exactly as written (no "007" → 7).
    assert frame[schema.USER].tolist() == ["A7", "007"]
    assert frame[schema.ITEM].tolist() == ["sku-1", "42"]
    assert frame[schema.TIMESTAMP].tolist() == [1700000000, 1700000100]
    assert frame[schema.EVENT].tolist() == ["click", "cart"]
    assert frame[schema.RATING].isna().all()


def test_read_parquet(tmp_path):
    path = tmp_path / "events.parquet"
    pd.DataFrame({"user_id": [1, 2], "item_id": ["a", "b"], "timestamp": [5, 6], "rating": [1.5, 2.0]}).to_parquet(path)
    frame = read_table(path)
    assert_canonical_dtypes(frame)
    assert frame[schema.USER].tolist() == ["1", "2"]
    assert frame[schema.RATING].tolist() == [1.5, 2.0]


def test_read_table_refuses_a_nested_value_as_a_batch_does(tmp_path):
    """The seed import made the id "{'id': 7}" of a JSON object; ingest refused the same file."""
    path = tmp_path / "events.jsonl"
    path.write_text('{"customer": {"id": 7}, "item_id": "a", "timestamp": 1700000000}\n')
    with pytest.raises(DataError) as refused:
        read_table(path, {schema.USER: "customer"})
    assert str(refused.value) == (f"{path}: column 'user_id' holds an object ({{'id': 7}}, data row 1) where "
                                  "one string or number is expected; write one value per field")


def test_read_table_mapping_to_absent_column(tmp_path):
    path = tmp_path / "events.csv"
    path.write_text("uid,item_id,timestamp\n1,2,3\n")
    with pytest.raises(DataError, match="userId"):
        read_table(path, {schema.USER: "userId"})


def test_read_table_missing_required_column(tmp_path):
    path = tmp_path / "events.csv"
    path.write_text("user_id,item_id\n1,2\n")
    with pytest.raises(DataError, match="timestamp"):
        read_table(path)


def test_read_table_unreadable_parquet(tmp_path):
    path = tmp_path / "events.parquet"
    path.write_bytes(b"definitely not parquet")
    with pytest.raises(DataError, match="events.parquet"):
        read_table(path)


def test_read_table_non_numeric_timestamp(tmp_path):
    path = tmp_path / "events.csv"
    path.write_text("user_id,item_id,timestamp\n1,2,yesterday\n")
    with pytest.raises(DataError, match="events.csv"):
        read_table(path)


def test_canonical_missing_column():
    with pytest.raises(DataError, match="item_id"):
        canonical(pd.DataFrame({"user_id": ["1"], "timestamp": [1]}))


# --- download -----------------------------------------------------------------------------------------------


def make_zip(path: Path, members: dict[str, str]) -> str:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in members.items():
            zf.writestr(name, text)
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def archive_dir(tmp_path) -> Path:
    source = tmp_path / "source"
    source.mkdir()
    return source


def test_download_file_url_with_sha256(tmp_path, archive_dir):
    archive = archive_dir / "ml.zip"
    digest = make_zip(archive, {"ml-1m/ratings.dat": "1::2::3::4\n", "ml-1m/README": "hi"})
    dest = tmp_path / "target" / "movielens"
    dest.parent.mkdir()
    assert download(archive.as_uri(), dest, sha256=digest) == dest
    assert (dest / "ml-1m" / "ratings.dat").read_text() == "1::2::3::4\n"
    assert read_movielens_1m(dest / "ml-1m")[schema.ITEM].tolist() == ["2"]
    assert sorted(p.name for p in dest.parent.iterdir()) == ["movielens"]  # no temporary leftovers


def test_download_wrong_sha256_leaves_nothing(tmp_path, archive_dir):
    archive = archive_dir / "ml.zip"
    make_zip(archive, {"ml-1m/ratings.dat": "1::2::3::4\n"})
    target = tmp_path / "target"
    target.mkdir()
    with pytest.raises(DataError, match="sha256 mismatch"):
        download(archive.as_uri(), target / "movielens", sha256="0" * 64)
    assert list(target.iterdir()) == []


def test_download_failure_keeps_previous_copy(tmp_path, archive_dir):
    archive = archive_dir / "ml.zip"
    make_zip(archive, {"ml-1m/ratings.dat": "new\n"})
    dest = tmp_path / "movielens"
    (dest / "ml-1m").mkdir(parents=True)
    (dest / "ml-1m" / "ratings.dat").write_text("old\n")
    with pytest.raises(DataError):
        download(archive.as_uri(), dest, sha256="f" * 64)
    assert (dest / "ml-1m" / "ratings.dat").read_text() == "old\n"


def test_download_replaces_only_the_archives_own_folder(tmp_path, archive_dir):
    """`--dest` is the folder to extract into: it replaced that whole folder (`--dest .` or a shared data
    folder lost everything in it); now only what the archive holds at its top (`ml-1m/`) is replaced."""
    archive = archive_dir / "ml.zip"
    digest = make_zip(archive, {"ml-1m/ratings.dat": "new\n"})
    dest = tmp_path / "datasets"
    (dest / "ml-1m").mkdir(parents=True)
    (dest / "ml-1m" / "ratings.dat").write_text("old\n")
    (dest / "ml-1m" / "stale.txt").write_text("from the old copy\n")
    (dest / "keep").mkdir()
    (dest / "keep" / "notes.txt").write_text("mine\n")
    (dest / "other.csv").write_text("a,b\n")
    assert download(archive.as_uri(), dest, sha256=digest) == dest
    assert (dest / "ml-1m" / "ratings.dat").read_text() == "new\n"
    assert not (dest / "ml-1m" / "stale.txt").exists()  # the archive's folder as the archive has it
    assert (dest / "keep" / "notes.txt").read_text() == "mine\n" and (dest / "other.csv").is_file()
    assert sorted(p.name for p in dest.iterdir()) == ["keep", "ml-1m", "other.csv"]  # no temporary folder


def test_download_refuses_a_file_or_a_url_it_cannot_open_in_one_error(tmp_path, archive_dir):
    archive = archive_dir / "ml.zip"
    digest = make_zip(archive, {"ml-1m/ratings.dat": "1::2::3::4\n"})
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(DataError, match="is a file: name a folder"):
        download(archive.as_uri(), afile, sha256=digest)
    for url in ("notaurl", "ftp://example.org/ml.zip"):
        with pytest.raises(DataError, match="is not an http"):
            download(url, tmp_path / "dest", sha256=digest)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "source"]


def test_an_interrupted_download_puts_every_old_entry_back(tmp_path, archive_dir, monkeypatch):
    """The archive's entries replace their old copies one rename at a time: an interrupt between two (a fault
    made here by a rename that raises) must leave the old copies, not one new and one gone."""
    archive = archive_dir / "ml.zip"
    digest = make_zip(archive, {"a/ratings.dat": "new a\n", "b/ratings.dat": "new b\n"})
    dest = tmp_path / "datasets"
    for name in "ab":
        (dest / name).mkdir(parents=True)
        (dest / name / "ratings.dat").write_text(f"old {name}\n")
    rename = Path.rename

    def interrupted(self, target):
        if Path(target) == dest / "b" and self.parent.name == "extracted":
            raise KeyboardInterrupt
        if self == dest / "a" and when == "after moving a aside":
            rename(self, target)
            raise KeyboardInterrupt  # the rename done, before the next line ran
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", interrupted)
    for when in ("after moving a aside", "placing b"):
        with pytest.raises(KeyboardInterrupt):
            download(archive.as_uri(), dest, sha256=digest)
        assert {p.name: (p / "ratings.dat").read_text() for p in dest.iterdir()} == {"a": "old a\n",
                                                                                    "b": "old b\n"}, when
        assert not any(p.name.startswith(".download-") for p in tmp_path.rglob("*"))  # no temporary folder
    monkeypatch.setattr(Path, "rename", rename)
    download(archive.as_uri(), dest, sha256=digest)
    assert (dest / "b" / "ratings.dat").read_text() == "new b\n"


@pytest.mark.parametrize("member", ["../evil.txt", "ml-1m/../../evil.txt", "/tmp/evil-abs.txt"])
def test_download_refuses_escaping_members(tmp_path, archive_dir, member):
    archive = archive_dir / "evil.zip"
    digest = make_zip(archive, {"ml-1m/ratings.dat": "1::2::3::4\n", member: "pwned"})
    target = tmp_path / "target"
    target.mkdir()
    with pytest.raises(DataError, match="escapes"):
        download(archive.as_uri(), target / "movielens", sha256=digest)
    assert list(target.iterdir()) == []
    assert not (tmp_path / "evil.txt").exists() and not (archive_dir.parent / "evil.txt").exists()


def test_download_needs_a_checksum(tmp_path, archive_dir):
    archive = archive_dir / "ml.zip"
    make_zip(archive, {"a": "b"})
    with pytest.raises(DataError, match="checksum"):
        download(archive.as_uri(), tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_download_not_a_zip(tmp_path, archive_dir):
    archive = archive_dir / "ml.zip"
    archive.write_bytes(b"plain text, not a zip")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    with pytest.raises(DataError, match="not a zip"):
        download(archive.as_uri(), tmp_path / "dest", sha256=digest)
    assert not (tmp_path / "dest").exists()


def test_download_missing_source(tmp_path):
    with pytest.raises(DataError, match="failed"):
        download((tmp_path / "absent.zip").as_uri(), tmp_path / "dest", sha256="0" * 64)


def test_download_movielens_mirror_must_match_official_md5(tmp_path, archive_dir):
    archive = archive_dir / "ml.zip"
    make_zip(archive, {"ml-1m/ratings.dat": "1::2::3::4\n"})
    with pytest.raises(DataError, match=r"md5 mismatch .*; file discarded \(another archive than the official "
                                        r"one: pass its --sha256 HEX\)$"):
        download_movielens("movielens-1m", tmp_path / "dest", url=archive.as_uri())
    with pytest.raises(DataError, match="unknown dataset"):
        download_movielens("movielens-25m", tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


# --- generator ----------------------------------------------------------------------------------------------

STRUCTURE = GenerateConfig(n_users=100, n_items=60, mean_events_per_user=20, n_clusters=4, days=60, seed=3)


def test_generate_is_deterministic(tiny_generate_config, tmp_path):
    a, b = generate(tiny_generate_config), generate(tiny_generate_config)
    pd.testing.assert_frame_equal(a.interactions, b.interactions)
    pd.testing.assert_frame_equal(a.items, b.items)
    part_a, part_b = write_store(a, tmp_path / "a"), write_store(b, tmp_path / "b")
    assert part_a.name == part_b.name == "part-0000000000000000.parquet"
    assert part_a.read_bytes() == part_b.read_bytes()
    assert (tmp_path / "a" / "items.csv").read_bytes() == (tmp_path / "b" / "items.csv").read_bytes()
    other = generate(GenerateConfig(**{**tiny_generate_config.__dict__, "seed": 2}))
    assert not other.interactions.equals(a.interactions)


def test_write_store_round_trips(tiny_generated, tmp_path):
    from recsys.store import read_store

    write_store(tiny_generated, tmp_path / "store")
    back = read_store(tmp_path / "store")
    pd.testing.assert_frame_equal(back[[schema.USER, schema.ITEM, schema.TIMESTAMP]],
                                  tiny_generated.interactions[[schema.USER, schema.ITEM, schema.TIMESTAMP]])


def test_write_table_same_rows_same_bytes(tiny_interactions, tmp_path):
    write_table(tiny_interactions, tmp_path / "a.parquet")
    write_table(tiny_interactions.copy(), tmp_path / "b.parquet")
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    assert not list(tmp_path.glob("*.tmp"))


def test_generate_shape(tiny_generated, tiny_generate_config):
    frame = tiny_generated.interactions
    assert_canonical_dtypes(frame)
    assert frame[schema.USER].nunique() == tiny_generate_config.n_users
    assert frame.groupby(schema.USER).size().min() >= 5
    assert set(frame[schema.ITEM]) <= {f"i{i}" for i in range(1, tiny_generate_config.n_items + 1)}
    assert (frame[schema.EVENT] == "view").all()
    # Times within a user strictly increase (spaced by ≥ 60 s).
    assert (frame.groupby(schema.USER)[schema.TIMESTAMP].diff().dropna() >= 60).all()
    assert len(tiny_generated.items) == tiny_generate_config.n_items


def _transitions(config: GenerateConfig):
    frame = generate(config).interactions
    item = frame[schema.ITEM].str[1:].astype(int).to_numpy() - 1  # 0-based; genre = item % n_clusters
    user = frame[schema.USER].to_numpy()
    same = user[1:] == user[:-1]
    return item[:-1][same], item[1:][same], frame[schema.TIMESTAMP].to_numpy()[1:][same]


def test_generate_plants_chains():
    c, n = STRUCTURE.n_clusters, STRUCTURE.n_items
    prev, nxt, _ = _transitions(STRUCTURE)
    chain_len = np.array([len(range(g, n, c)) for g in range(c)])
    genre, pos = prev % c, prev // c
    successor = (pos + 1) % chain_len[genre] * c + genre
    skip = (pos + 2) % chain_len[genre] * c + genre
    follows = (nxt == successor) | (nxt == skip)
    # The generator walks forward along the chain 80 % of the time (a fifth of those skip one step);
    # a random walk would follow it ~2/60 of the time.
    assert follows.mean() > 0.7
    assert (nxt == successor).mean() > 0.5


def test_generate_plants_time_effect():
    c = STRUCTURE.n_clusters
    prev, nxt, t = _transitions(STRUCTURE)
    hour, weekday = (t // 3600) % 24, ((t // 86400) + 3) % 7
    leisure = (hour >= 18) | (weekday >= 5)
    jump = (nxt % c) != (prev % c)  # a switch of genre
    odd = (nxt % c) % 2 == 1
    assert (jump & leisure).sum() > 30 and (jump & ~leisure).sum() > 30
    # Evening/weekend jumps favour odd genres; working-hours jumps favour even ones.
    assert odd[jump & leisure].mean() - odd[jump & ~leisure].mean() > 0.3


def test_a_seed_write_killed_midway_leaves_a_temp_the_next_ingest_removes(tiny_interactions, tmp_path,
                                                                           monkeypatch):
    """The seed part's temp was `part-….parquet.tmp` beside the parts: a kill left it in the store, and the
    next ingest's `dvc add` versioned it as data. (The kill is simulated: the write stops after the temp is
    on disk, as SIGKILL would stop it, without the cleanup a Python exception runs.)"""
    import recsys.data as data_module
    from recsys.store import remove_stale_temp_files

    written = []

    def write_then_die(table, where, **kwargs):
        Path(where).write_bytes(b"half a part")
        written.append(Path(where))
        raise KeyboardInterrupt

    monkeypatch.setattr(data_module.pq, "write_table", write_then_die)
    part = tmp_path / "data" / "interactions" / data_module.SEED_PART
    with pytest.raises(KeyboardInterrupt):
        write_table(tiny_interactions, part)
    [temp] = written
    assert temp.parent == part.parent and temp.name.startswith(".tmp-") and not temp.exists()  # cleaned
    temp.write_bytes(b"half a part")  # what SIGKILL leaves: no cleanup ran
    assert remove_stale_temp_files(tmp_path / "data") == [temp] and not part.exists()


def test_bootstrap_knows_the_files_the_seed_is_written_as(tmp_path):
    """Bootstrap tells its seed from ingested data by the seed's file names (and data.dvc's file count): they
    must be what `write_store` writes."""
    from recsys.bootstrap import _seed_names
    from recsys.data import generate, write_store

    write_store(generate(GenerateConfig(n_users=20, n_items=15, mean_events_per_user=6)), tmp_path)
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == sorted(_seed_names())


def test_an_atomic_write_removes_what_a_killed_writer_left(tmp_path):
    """A kill between a writer's temp file and its rename leaves `.<name>.<host>.<pid>.tmp`; the next write into
    that folder removes it, whichever file it writes (`data batch 1` killed, then `data batch 2`). A temp file
    of a writer that still runs, and files of other names, are left alone; so is another machine's (a folder
    several hosts share: its PID means nothing here) or an older version's `.<name>.<pid>.tmp` until it is a
    day old."""
    import subprocess

    from recsys.atomic import FOREIGN_STALE_SECONDS, HOST, write_text_atomic

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                           text=True, check=True)
    dead = int(ended.stdout)
    killed = tmp_path / f".items.csv.{HOST}.{dead}.tmp"
    other = tmp_path / f".users.csv.{HOST}.{dead}.tmp"
    remote = tmp_path / f".items.csv.producer-7.{dead}.tmp"  # a live writer on another host, for all we know
    legacy = tmp_path / f".items.csv.{dead}.tmp"
    remote_old = tmp_path / f".users.csv.producer-7.{dead}.tmp"
    legacy_old = tmp_path / f".users.csv.{dead}.tmp"
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as living:
        running = tmp_path / f".items.csv.{HOST}.{living.pid}.tmp"
        kept = [running, remote, legacy, tmp_path / "notes.tmp", tmp_path / ".hidden.tmp"]
        for leftover in (killed, other, remote_old, legacy_old, *kept):
            leftover.write_text("half")
        day_ago = time.time() - FOREIGN_STALE_SECONDS - 60
        for old in (remote_old, legacy_old):
            os.utime(old, (day_ago, day_ago))
        try:
            write_text_atomic(tmp_path / "items.csv", "item_id\n1\n", tmp_path)
        finally:
            living.kill()
    assert (tmp_path / "items.csv").read_text() == "item_id\n1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["items.csv", *(p.name for p in kept)])
