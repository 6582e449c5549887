"""The `recsys` command line: user errors print one clear line and exit 1, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from recsys.cli import main


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run `recsys <args>` in-process with the console script's semantics (recsys.cli:main)."""
    from recsys.entry import VERBOSE_ENV

    monkeypatch.setattr(sys, "argv", ["recsys", *args])
    monkeypatch.setenv(VERBOSE_ENV, "")  # `--verbose` sets it for the process: undone after the test
    code = 0
    try:
        main()
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err: str, *fragments: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize("command", ["train", "evaluate"])
@pytest.mark.parametrize("name", ["x;drop", "../../etc", "SASRec"])
def test_invalid_model_name(monkeypatch, capsys, command, name):
    code, _, err = run_cli(monkeypatch, capsys, command, "--model", name)
    assert code == 1
    assert_one_line_error(err, "invalid model name", repr(name))


@pytest.mark.parametrize("command", [("train",), ("evaluate",), ("registry", "promote")])
def test_an_unknown_model_is_named_with_the_known_ones(monkeypatch, capsys, tmp_path, write_params, command):
    """evaluate said 'artifacts/models/nosuch is not a checkpoint',
    promote 'run dvc repro evaluate@nosuch'."""
    params = write_params({})
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(monkeypatch, capsys, *command, "--model", "nosuch", "--params", str(params))
    assert code == 1
    assert_one_line_error(err, "unknown model 'nosuch': params.yaml has no section for it; known models are")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_evaluate_before_training_says_what_trains_it(monkeypatch, capsys, tmp_path, write_params):
    """It said 'artifacts/models/sasrec is not a checkpoint: artifacts/models/sasrec/model.json missing'."""
    params = write_params({})
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(monkeypatch, capsys, "evaluate", "--model", "sasrec", "--params", str(params))
    assert code == 1
    assert_one_line_error(err, "artifacts/models/sasrec holds no trained sasrec: run "
                               "`dvc repro train@sasrec` (or `recsys train --model sasrec`) first")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_bad_params_file(monkeypatch, capsys, tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("train:\n  epochz: 3\n")
    code, _, err = run_cli(monkeypatch, capsys, "train", "--model", "sasrec", "--params", str(params))
    assert code == 1
    assert_one_line_error(err, "epochz")


def test_wrongly_typed_params(monkeypatch, capsys, tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("train:\n  epochs: many\n")
    code, _, err = run_cli(monkeypatch, capsys, "prepare", "--params", str(params))
    assert code == 1
    assert_one_line_error(err, "train.epochs")


def test_missing_params_file(monkeypatch, capsys, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, "data", "generate", "--params", str(tmp_path / "absent.yaml"),
                           "--out", str(tmp_path / "data"))
    assert code == 1
    assert_one_line_error(err, "not found")
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("overrides, says", [
    ({"sasrec": {"n_heads": 0}}, "error: sasrec.n_heads must be >= 1, got 0"),
    ({"sasrec": {"dim": 0}}, "error: sasrec.dim must be >= 1, got 0"),
    ({"bert4rec": {"dropout": 1.5}}, "error: bert4rec.dropout must be in [0, 1), got 1.5"),
    ({"mojito": {"train": {"seed": -1}}}, "error: mojito.train.seed must be in [0, 4294967295]"),
    ({"generate": {"start": "notadate"}}, "error: generate.start must be an ISO 8601 date and time"),
    ({"generate": {"days": 0}}, "error: generate.days must be >= 1, got 0"),
    ({"generate": {"n_users": -1}}, "error: generate.n_users must be >= 1, got -1"),
    ({"gate": {"metric": "foo"}}, "error: gate.metric 'foo' is not a metric the evaluate stage writes"),
    ({"evaluate": {"ks": []}}, "error: evaluate.ks must be a non-empty list of cut-offs >= 1, got []"),
    ({"ingest": {"max_bad_row_share": 2}}, "error: ingest.max_bad_row_share must be in [0, 1], got 2.0"),
])
@pytest.mark.parametrize("command", [("data", "generate", "--out", "data"), ("registry", "list"), ("warm",)])
def test_a_setting_out_of_range_is_one_line_naming_its_key_and_nothing_is_written(
        monkeypatch, capsys, tmp_path, write_params, overrides, says, command):
    """Each was a traceback, or was accepted and refused every candidate later with exit 0."""
    models = ["mostpop", "sasrec", "bert4rec", "mojito"]  # every model section is checked, listed or not
    params = write_params({**overrides, "models": models})
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(monkeypatch, capsys, *command, "--params", str(params))
    assert code == 1 and out == ""
    assert_one_line_error(err, says)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


READS_PARAMS = [("warm",), ("registry", "list"), ("ingest",), ("prepare",),
                ("data", "generate", "--out", "data")]


@pytest.mark.parametrize("command", READS_PARAMS)
def test_params_that_is_a_folder_is_one_line_naming_it_and_the_option(monkeypatch, capsys, tmp_path, command):
    """`recsys warm --params inbox` was an IsADirectoryError traceback, `registry list` said
    'error: [Errno 21] Is a directory: 'inbox''."""
    (tmp_path / "inbox").mkdir()
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(monkeypatch, capsys, *command, "--params", "inbox")
    assert code == 1 and out == ""
    assert_one_line_error(err, "error: params file inbox is a folder: pass --params PATH naming the "
                               "params.yaml file itself")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inbox"]


@pytest.mark.parametrize("command", READS_PARAMS)
@pytest.mark.parametrize("content, says", [
    ("models: [mostpop]\n# caf\u00e9\n".encode("latin-1"), "is not UTF-8 text: byte 0xe9 on line 2"),
    (b"train: {epochs: 3\n", ("is not valid YAML: line 2, column 1: expected ',' or '}', but got '<stream "
                              "end>' (while parsing a flow mapping from line 1, column 8)")),
    (b"train:\n\tepochs: 3\n", ("is not valid YAML: line 2, column 1: found character '\\t' that cannot "
                                "start any token")),
])
def test_a_params_file_that_does_not_parse_is_one_line_on_every_command(monkeypatch, capsys, tmp_path,
                                                                        command, content, says):
    """A Latin-1 byte was a UnicodeDecodeError traceback; invalid YAML, pyyaml's 7-line caret diagram."""
    (tmp_path / "params.yaml").write_bytes(content)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(monkeypatch, capsys, *command)
    assert code == 1 and out == ""
    assert_one_line_error(err, f"error: params file params.yaml {says}" if "UTF-8" in says
                          else f"error: params.yaml {says}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


@pytest.mark.parametrize("command", READS_PARAMS)
def test_run_from_a_subfolder_says_where_it_looked_for_params(monkeypatch, capsys, tmp_path, write_params,
                                                              command):
    """It said only 'params file not found: params.yaml'."""
    write_params()
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    code, out, err = run_cli(monkeypatch, capsys, *command)
    assert code == 1 and out == ""
    assert_one_line_error(err, f"error: params file not found: {tmp_path / 'notebooks' / 'params.yaml'} "
                               "(relative to the current folder): run from the repository root or pass "
                               "--params PATH")
    assert sorted(p.name for p in (tmp_path / "notebooks").iterdir()) == []


def test_data_generate(monkeypatch, capsys, tmp_path, write_params, tiny_generated):
    from recsys.store import read_store

    code, out, _ = run_cli(monkeypatch, capsys, "data", "generate", "--params", str(write_params()),
                           "--out", str(tmp_path / "data"))
    assert code == 0 and "part-0000000000000000.parquet" in out
    stored = read_store(tmp_path / "data")
    assert stored["item_id"].tolist() == tiny_generated.interactions["item_id"].tolist()


def test_data_import_without_out_names_the_store_it_wrote_in_its_dvc_hint(monkeypatch, capsys, tmp_path,
                                                                          write_params):
    """No --out: the store is data/ beside the params file, and the hint says `dvc add data` (it said `dvc
    add None`: the option's value, not the folder written)."""
    params = write_params()
    (tmp_path / ".dvc").mkdir()  # a DVC repository, as a clone is
    source = tmp_path / "events.csv"
    source.write_text("user_id,item_id,timestamp\na,x,1704067210\nb,y,1704067220\n")
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(monkeypatch, capsys, "data", "import", "table", str(source), "--params", str(params))
    assert code == 0 and (tmp_path / "data").is_dir()
    assert out.rstrip().endswith("; run `dvc add data` to version them")
    # From outside the repository, `dvc add data` would refuse ("outside of DVC project"): where to run it.
    monkeypatch.chdir(tmp_path.parent)
    code, out, _ = run_cli(monkeypatch, capsys, "data", "import", "table", str(source), "--params", str(params),
                           "--out", str(tmp_path / "other"))
    assert code == 0 and out.rstrip().endswith(f"; run `dvc add other` in {tmp_path.resolve()} to version them")


def test_the_dvc_hint_is_a_command_that_runs_where_it_says(monkeypatch, tmp_path):
    """The repository's root is no store `dvc add` takes; a path with a space is quoted; a removed current
    folder is outside any repository (the import has written its store: no traceback after it); a link into
    the repository is named as DVC takes it, not followed elsewhere."""
    from recsys.ingest.dvc import dvc_add_hint

    repo = tmp_path / "my repo"
    (repo / ".dvc").mkdir(parents=True)
    monkeypatch.chdir(repo)
    assert dvc_add_hint(Path(".")) == (". is a DVC repository's root, which `dvc add` cannot version: import "
                                       "into its data/")
    assert dvc_add_hint(Path("my data")) == "run `dvc add 'my data'` to version them"
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert dvc_add_hint(repo / "data") == f"run `dvc add data` in '{repo}' to version them"
    outside = tmp_path / "outside"
    outside.mkdir()
    (repo / "linked").symlink_to(outside)
    assert dvc_add_hint(repo / "linked") == f"run `dvc add linked` in '{repo}' to version them"


def test_data_import_table_with_mapping(monkeypatch, capsys, tmp_path):
    from recsys.store import read_store

    source = tmp_path / "events.csv"
    source.write_text("uid,sku,ts\na,x,1704067210\nb,y,1704067220\n")
    code, out, _ = run_cli(monkeypatch, capsys, "data", "import", "table", str(source), "--out",
                           str(tmp_path / "store"), "--column", "user_id=uid", "--column", "item_id=sku",
                           "--column", "timestamp=ts")
    assert code == 0 and "wrote 2 interactions" in out
    store = tmp_path / "store"  # in no DVC repository: no `dvc add` that would fail
    assert out.rstrip().endswith(f"; {store} is in no DVC repository (no .dvc/ in it or above it): import into "
                                 "a repository's data/ to version it with `dvc add`")
    stored = read_store(tmp_path / "store")
    assert stored[["user_id", "item_id", "timestamp"]].values.tolist() == [["a", "x", 1704067210],
                                                                           ["b", "y", 1704067220]]


MAPPING = ["--column", "user_id=uid", "--column", "item_id=sku", "--column", "timestamp=ts"]


def test_a_seed_column_no_mapping_names_is_refused_as_a_batch_column_is(monkeypatch, capsys, tmp_path,
                                                                       write_params):
    """An unmapped column (here the event types, `--column event=kind` forgotten) was dropped without a word:
    the seed lost every event type that a batch with the same columns is rejected for. Refused, naming the
    column and both ways out; with `ingest.extra_columns: drop` it is left out, as from a batch."""
    from recsys.store import read_store

    source = tmp_path / "events.csv"
    source.write_text("uid,sku,ts,kind\na,x,1704067210,view\nb,y,1704067220,buy\n")
    store = tmp_path / "data"
    code, out, err = run_cli(monkeypatch, capsys, "data", "import", "table", str(source), "--out", str(store),
                             *MAPPING)
    assert code == 1 and out == ""
    assert_one_line_error(err, (f"error: {source}: column(s) ['kind'] map to none of user_id, item_id, "
                                "timestamp, rating, event: name them with --column CANONICAL=COLUMN (or set "
                                "ingest.column_mapping in params.yaml), or set ingest.extra_columns: drop to "
                                "leave them out"))
    assert not store.exists()
    params = write_params({"ingest": {"extra_columns": "drop"}})
    code, out, _ = run_cli(monkeypatch, capsys, "data", "import", "table", str(source), "--out", str(store),
                           *MAPPING, "--params", str(params))
    assert code == 0 and "wrote 2 interactions" in out
    assert read_store(store)["event"].isna().all()


def test_a_seed_import_without_column_options_maps_by_params_yaml(monkeypatch, capsys, tmp_path, write_params):
    """README's later batches read `ingest.column_mapping`; the seed import ignored it, and without `--column`
    said only which columns were missing. It now takes params.yaml's mapping, and a file that still lacks a
    column is told how to name it."""
    from recsys.store import read_store

    source = tmp_path / "events.csv"
    source.write_text("uid,sku,ts\na,x,1704067210\n")
    store = tmp_path / "data"
    code, _, err = run_cli(monkeypatch, capsys, "data", "import", "table", str(source), "--out", str(store))
    assert code == 1
    assert_one_line_error(err, (f"error: {source}: missing required column(s) ['user_id', 'item_id', "
                                "'timestamp']; the file has ['uid', 'sku', 'ts']: name them with --column "
                                "CANONICAL=COLUMN (or set ingest.column_mapping in params.yaml)"))
    params = write_params({"ingest": {"column_mapping": {"user_id": "uid", "item_id": "sku", "timestamp": "ts"}}})
    code, out, _ = run_cli(monkeypatch, capsys, "data", "import", "table", str(source), "--out", str(store),
                           "--params", str(params))
    assert code == 0 and "wrote 1 interactions" in out
    assert read_store(store)[["user_id", "item_id"]].values.tolist() == [["a", "x"]]


@pytest.mark.parametrize(("rows", "says"), [
    ("", "0 data rows: a seed needs at least ingest.min_rows = 1"),
    ("a,x,1704067200000\n", ("1 of 1 rows fail the checks every ingested batch gets: 1 × timestamp before "
                              "the configured floor or too far in the future")),  # milliseconds, not seconds
    ("a,x,-5\nb,y,1704067200\n", "1 of 2 rows fail"),
    ("a,x,1704067200,like\n", ("1 of 1 rows fail the checks every ingested batch gets: 1 × event is not "
                                "one of ingest.allowed_events")),
])
def test_a_seed_import_gets_the_row_checks_of_a_batch_and_a_refusal_keeps_the_store(
        monkeypatch, capsys, tmp_path, rows, says):
    """A header-only file replaced the seed with nothing (exit 0); a timestamp in milliseconds, a negative one
    or an event a batch may not carry were stored as they came."""
    from recsys.store import read_store

    store = tmp_path / "data"
    source = tmp_path / "events.csv"
    source.write_text("uid,sku,ts\nk,z,1704067200\n")
    assert run_cli(monkeypatch, capsys, "data", "import", "table", str(source), "--out", str(store),
                   *MAPPING)[0] == 0
    before = read_store(store)
    header = "uid,sku,ts,kind" if "like" in rows else "uid,sku,ts"
    source.write_text(f"{header}\n{rows}")
    extra = ["--column", "event=kind"] if "like" in rows else []
    code, out, err = run_cli(monkeypatch, capsys, "data", "import", "table", str(source), "--out", str(store),
                             *MAPPING, *extra)
    assert code == 1 and out == ""
    assert_one_line_error(err, f"error: {source}: {says}")
    assert "ingest.timestamp_floor = 788918400" in err or "min_rows" in err
    assert read_store(store).equals(before)


def test_a_seed_import_of_a_folder_says_it_is_one(monkeypatch, capsys, tmp_path):
    (tmp_path / "export.parquet").mkdir()
    code, _, err = run_cli(monkeypatch, capsys, "data", "import", "table", str(tmp_path / "export.parquet"),
                           "--out", str(tmp_path / "data"), *MAPPING)
    assert code == 1
    assert_one_line_error(err, "export.parquet is a folder: name one file")  # it said "not found"
    assert not (tmp_path / "data").exists()


def test_a_seed_import_keeps_a_repeated_event_once(monkeypatch, capsys, tmp_path):
    from recsys.store import read_store

    source = tmp_path / "events.csv"
    source.write_text("uid,sku,ts\na,b,1704067200\na,b,1704067200\na,c,1704067200\n")
    code, out, _ = run_cli(monkeypatch, capsys, "data", "import", "table", str(source), "--out",
                           str(tmp_path / "data"), *MAPPING)
    assert code == 0 and "wrote 2 interactions (1 repeated events kept once)" in out
    assert read_store(tmp_path / "data")[["user_id", "item_id"]].values.tolist() == [["a", "b"], ["a", "c"]]


def test_data_import_bad_input(monkeypatch, capsys, tmp_path):
    (tmp_path / "ratings.dat").write_text("1::2::oops::x\n")
    code, _, err = run_cli(monkeypatch, capsys, "data", "import", "movielens-1m", str(tmp_path),
                           "--out", str(tmp_path / "data"))
    assert code == 1
    assert_one_line_error(err, "ratings.dat")
    assert not (tmp_path / "data").exists()


def test_data_download_checksum_mismatch(monkeypatch, capsys, tmp_path):
    import zipfile

    archive = tmp_path / "ml.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("ml-1m/ratings.dat", "1::2::3::4\n")
    code, _, err = run_cli(monkeypatch, capsys, "data", "download", "movielens-1m", "--dest",
                           str(tmp_path / "ml"), "--url", archive.as_uri(), "--sha256", "0" * 64)
    assert code == 1
    assert_one_line_error(err, "sha256 mismatch")
    assert not (tmp_path / "ml").exists()


def test_data_download_refuses_an_empty_or_file_dest_before_fetching(monkeypatch, capsys, tmp_path):
    """`--dest ""` was the current folder, which the download then deleted (a clone, .git and all)."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    for dest, says in (("", "Invalid value for '--dest': empty: name a folder"),
                       (str(afile), f"Invalid value for '--dest': {afile} is a file: name a folder")):
        code, out, err = run_cli(monkeypatch, capsys, "data", "download", "movielens-1m", "--dest", dest,
                                 "--url", (tmp_path / "absent.zip").as_uri(), "--sha256", "0" * 64)
        assert code == 2 and out == ""
        assert_one_line_error(err, f"recsys data download: {says}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.parametrize("option, value, says", [
    ("--url", "", "Invalid value for '--url': is empty: leave it out for the official archive"),  # was the default
    # a value of the wrong kind was exit 1, as if the fetch had failed
    ("--url", "not a url", "Invalid value for '--url': 'not a url' is not an http(s):// or file:// URL"),
    ("--url", "ftp://x/ml-1m.zip", "Invalid value for '--url': 'ftp://x/ml-1m.zip' is not an http(s):// or"),
    ("--url", "http://[::1", "Invalid value for '--url': 'http://[::1' is not a URL (Invalid IPv6 URL)"),  # was a
    ("--url", "http://x:99999/a.zip", "Invalid value for '--url': 'http://x:99999/a.zip' is not a URL (Port out"),
    ("--url", "https:///ml-1m.zip", "Invalid value for '--url': 'https:///ml-1m.zip' names no host"),  # traceback
    ("--sha256", "", "Invalid value for '--sha256': '' is not a sha256 (64 hex digits)"),  # was MD5 instead
    ("--sha256", "nothex", "Invalid value for '--sha256': 'nothex' is not a sha256"),  # was found after the fetch
    ("--sha256", "0" * 63, f"Invalid value for '--sha256': '{'0' * 63}' is not a sha256"),
])
def test_data_download_refuses_an_empty_url_or_a_malformed_sha256_before_fetching(monkeypatch, capsys, tmp_path,
                                                                                 option, value, says):
    args = {"--url": (tmp_path / "absent.zip").as_uri(), "--sha256": "0" * 64, option: value}
    code, out, err = run_cli(monkeypatch, capsys, "data", "download", "movielens-1m", "--dest",
                             str(tmp_path / "ml"), *[x for pair in args.items() for x in pair])
    assert code == 2 and out == ""
    assert_one_line_error(err, f"recsys data download: {says}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("index", ["1.0", "+1", " 3", "3 ", "1_0", "01", "٣", "1e3"])
def test_data_batch_index_is_a_plain_whole_number(monkeypatch, capsys, tmp_path, write_params, index):
    """Click's int took all of these ("1_0" as batch 10); the flows and the registry commands refuse them."""
    params = write_params()
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(monkeypatch, capsys, "data", "batch", "--params", str(params), "--", index)
    assert code == 2 and out == ""
    assert_one_line_error(err, f"recsys data batch: Invalid value for 'INDEX': {index!r} is not a whole number "
                               "written plainly (1, 2, …)", "(see 'recsys data batch --help')")
    assert not (tmp_path / "inbox").exists()


@pytest.mark.parametrize(("args", "says"), [
    (["train", "--no-such-option"], "recsys train: No such option: --no-such-option"),
    (["train"], "recsys train: Missing option '--model'"),
    (["registry", "history", "--nope"], "recsys registry history: No such option: --nope"),
    (["nosuch"], "recsys: No such command 'nosuch'"),
    # an option given no value: Click raises it without the command's context
    (["recommend", "--user"], "recsys recommend: Option '--user' requires an argument"),
    (["--verbose", "registry", "history", "-n"], "recsys registry history: Option '-n' requires an argument"),
    (["data", "batch", "2", "--out"], "recsys data batch: Option '--out' requires an argument"),
    # Click reads a negative number as an option: the line says how to give one
    (["data", "batch", "-1"], ("recsys data batch: No such option: -1: a value that starts with '-' goes "
                               "after '--' (recsys data batch -- -1)")),
    # an empty path was the current folder, refused as "outside the inbox"
    (["ingest", ""], ("recsys ingest: Invalid value for 'PATHS...': empty: name a batch file in the inbox "
                      "(or none: every file in it)")),
    (["data", "download", "movielens-20m", "--dest", "x"],
     ("recsys data download: Invalid value for 'NAME': 'movielens-20m' is not one of movielens-1m | "
      "movielens-100k")),
])
def test_usage_error_is_one_line_naming_the_help(monkeypatch, capsys, args, says):
    """Click's refusal was a four-line block (usage, a hint, a blank line, the error): now the one line."""
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2 and out == ""
    command = says.split(":")[0]
    assert_one_line_error(err, says, f"(see '{command} --help')")


@pytest.mark.parametrize("group", ["data", "registry"])
def test_a_group_without_a_command_prints_its_help_and_no_empty_error_line(monkeypatch, capsys, group):
    code, out, err = run_cli(monkeypatch, capsys, group)
    assert code == 2 and f"Usage: recsys {group} [OPTIONS] COMMAND [ARGS]..." in out and err == ""


PYTHON_M_ENTRY_POINTS = ["recsys.prepare", "recsys.train", "recsys.evaluate", "recsys.dvc_graph",
                         "flows.ingest", "flows.retrain", "flows.pipeline", "flows.zombies", "flows.serve",
                         "flows.train_model"]


def test_every_module_with_a_flow_is_an_entry_point_with_a_help():
    """`python -m flows.train_model --help` printed nothing and exited 0: a module that defines a flow is
    one a person may start, so it is in the list the refusal test below runs."""
    flows = Path(__file__).resolve().parent.parent / "flows"
    with_a_flow = sorted(f"flows.{path.stem}" for path in flows.glob("*.py")
                         if "\n@flow(" in path.read_text(encoding="utf-8"))
    assert "flows.retrain" in with_a_flow and "flows.train_model" in with_a_flow  # (the scan finds flows)
    assert set(with_a_flow) <= set(PYTHON_M_ENTRY_POINTS), with_a_flow


def test_the_worker_flow_says_what_starts_it(capsys):
    from flows.train_model import main

    with pytest.raises(SystemExit) as done:
        main([])
    assert done.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert_one_line_error(err, "error: python -m flows.train_model: this flow runs on a pool's worker",
                          "python -m flows.retrain --fan-out train-model/worker",
                          "python -m flows.retrain --models MODEL")
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    out, _ = capsys.readouterr()
    assert done.value.code == 0 and "usage: python -m flows.train_model" in out
    assert "train-model/worker" in out and "python -m flows.retrain --models MODEL" in out


@pytest.mark.parametrize("module", PYTHON_M_ENTRY_POINTS)
def test_every_python_m_entry_point_refuses_in_one_line_naming_itself(capsys, module):
    """argparse printed its usage block and named the module's file (`retrain.py: error: ...`), which is not
    the command a person typed (`python -m flows.retrain`)."""
    import importlib

    with pytest.raises(SystemExit) as done:
        model = ["--model", "sasrec"] if module in ("recsys.train", "recsys.evaluate") else []
        importlib.import_module(module).main([*model, "--no-such-option"])
    assert done.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert_one_line_error(err, f"error: python -m {module}: unrecognized arguments: --no-such-option "
                               f"(see 'python -m {module} --help')")


@pytest.mark.parametrize("within", ["-5", "0", "1.5", "soon"])
def test_zombies_within_must_be_a_whole_number_of_seconds(capsys, within):
    """`--within -5` passed argparse and was refused later, exit 1, without the help."""
    from flows.zombies import main as zombies

    with pytest.raises(SystemExit) as done:
        zombies(["--within", within])
    assert done.value.code == 2
    assert_one_line_error(capsys.readouterr().err,
                          "python -m flows.zombies: argument --within: expected a whole number of at least "
                          f"1, got {within!r} (see 'python -m flows.zombies --help')")


def test_prepare_on_an_empty_store(monkeypatch, capsys, tmp_path, write_params):
    """`prepare` over an empty store: PrepareError (a user error), one line, nothing written."""
    params = write_params()
    monkeypatch.chdir(tmp_path)  # (the stages read data/ and write artifacts/ beside the params file)
    code, _, err = run_cli(monkeypatch, capsys, "prepare", "--params", str(params))
    assert code == 1
    assert_one_line_error(err, "no interactions")
    assert not (tmp_path / "artifacts").exists()


@pytest.mark.slow
def test_console_script_refuses_injection(repo_root, tmp_path):
    """The installed `recsys` entry point, as a user runs it."""
    env = {**os.environ, "PATH": f"{repo_root / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run([str(repo_root / ".venv" / "bin" / "recsys"), "train", "--model", "x;drop"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert [line for line in done.stderr.splitlines() if line.strip()] == [
        "error: invalid model name 'x;drop': use lowercase letters, digits and _ (max 64)"]


def test_data_import_and_generate_refuse_to_mix_a_dataset_with_ingested_batches(
        monkeypatch, capsys, tmp_path, tiny_store):
    ratings = tmp_path / "ml" / "u.data"
    ratings.parent.mkdir()
    ratings.write_text("".join(f"{u}\t{i}\t4\t{880000000 + u * 10 + i}\n" for u in range(1, 4) for i in range(1, 4)))
    batch = tiny_store / "interactions" / "part-00000000deadbeef.parquet"
    seed = tiny_store / "interactions" / "part-0000000000000000.parquet"
    batch.write_bytes(seed.read_bytes())
    before = seed.read_bytes()

    code, _, err = run_cli(monkeypatch, capsys, "data", "import", "movielens-100k", str(ratings.parent),
                           "--out", str(tiny_store))
    assert code == 1
    assert_one_line_error(err, "already holds 1 ingested batch(es)", "part-00000000deadbeef.parquet")
    assert seed.read_bytes() == before  # nothing rewritten

    # `data generate` writes the seed too, and refuses the same way (it silently rewrote it under the batch)
    code, _, err = run_cli(monkeypatch, capsys, "data", "generate", "--out", str(tiny_store))
    assert code == 1
    assert_one_line_error(err, "already holds 1 ingested batch(es)", "into an empty folder with --out",
                          "never deleted by hand")
    assert seed.read_bytes() == before

    batch.unlink()
    code, out, _ = run_cli(monkeypatch, capsys, "data", "import", "movielens-100k", str(ratings.parent),
                           "--out", str(tiny_store))
    assert code == 0 and "wrote 9 interactions" in out


# --- errors a person can act on: one line with the numbers and the setting; --verbose adds the traceback ---

def _store_in_cwd(monkeypatch, tmp_path, frame) -> None:
    import pandas as pd

    from recsys.data import Generated, write_store

    monkeypatch.chdir(tmp_path)  # (the stage reads data/ and writes artifacts/ beside the params file)
    write_store(Generated(frame, pd.DataFrame(columns=["item_id", "title"])), tmp_path / "data")


def test_prepare_filter_that_keeps_nothing_names_the_numbers_and_the_setting(monkeypatch, capsys, tmp_path,
                                                                              write_params, tiny_interactions):
    params = write_params({"prepare": {"min_user_interactions": 1000, "min_item_interactions": 1000}})
    _store_in_cwd(monkeypatch, tmp_path, tiny_interactions)
    code, _, err = run_cli(monkeypatch, capsys, "prepare", "--params", str(params))
    assert code == 1
    assert_one_line_error(err, f"1000-core filter kept 0 of {len(tiny_interactions):,} events",
                          "prepare.min_user_interactions / min_item_interactions in params.yaml (now 1000/1000)")
    assert not (tmp_path / "artifacts").exists()


def test_the_stage_as_dvc_runs_it_reports_a_user_error_in_one_line(tmp_path, write_params, tiny_interactions):
    """`dvc repro` runs `python -m recsys.prepare`: the module is `__main__` there, and its own error class
    must still be reported as one line (exit 1), not a traceback."""
    from pathlib import Path

    import pandas as pd

    from recsys.data import Generated, write_store

    params = write_params({"prepare": {"min_user_interactions": 1000, "min_item_interactions": 1000}})
    write_store(Generated(tiny_interactions, pd.DataFrame(columns=["item_id", "title"])), tmp_path / "data")
    env = {k: v for k, v in os.environ.items() if k != "RECSYS_VERBOSE"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    run = subprocess.run([sys.executable, "-m", "recsys.prepare", "--params", str(params)], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr[-2000:]
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: 1000-core filter kept 0 of {len(tiny_interactions):,} events; lower "
                      "prepare.min_user_interactions / min_item_interactions in params.yaml (now 1000/1000)"]


def test_prepare_of_a_dataset_too_small_to_split(monkeypatch, capsys, tmp_path, write_params):
    import pandas as pd

    two_each = pd.DataFrame({"user_id": ["a", "a", "b", "b"], "item_id": ["x", "y", "x", "y"],
                             "timestamp": [1_700_000_000 + i for i in range(4)]})
    params = write_params({"prepare": {"min_user_interactions": 1, "min_item_interactions": 1}})
    _store_in_cwd(monkeypatch, tmp_path, two_each)
    code, _, err = run_cli(monkeypatch, capsys, "prepare", "--params", str(params))
    assert code == 1
    assert_one_line_error(err, "too small to split", "2 users with 4 events", "(now 1/1)")


def test_verbose_is_moved_to_the_group_but_not_from_after_a_double_dash():
    from recsys.cli import verbose_first

    assert verbose_first(["registry", "history", "-v", "-n", "3"]) == ["-v", "registry", "history", "-n", "3"]
    assert verbose_first(["data", "batch", "--", "--verbose"]) == ["data", "batch", "--", "--verbose"]


def test_verbose_that_is_an_options_value_stays_its_value(monkeypatch, capsys, tmp_path):
    """`--user -v` names a user `-v` (Click gives an option the next word); moving it to the group left
    `--user` without its value ("Option '--user' requires an argument")."""
    from recsys.cli import verbose_first

    assert verbose_first(["recommend", "--user", "-v"]) == ["recommend", "--user", "-v"]
    assert verbose_first(["recommend", "--user", "-v", "-v"]) == ["-v", "recommend", "--user", "-v"]
    monkeypatch.chdir(tmp_path)  # no params.yaml: the refusal after the options were read
    code, _, err = run_cli(monkeypatch, capsys, "recommend", "--user", "-v")
    assert code == 1
    assert_one_line_error(err, "params file not found")


def test_unknown_model_names_the_known_ones(monkeypatch, capsys, write_params):
    code, _, err = run_cli(monkeypatch, capsys, "train", "--model", "nosuch", "--params", str(write_params()))
    assert code == 1
    assert_one_line_error(err, "unknown model 'nosuch'", "'sasrec'")


@pytest.mark.parametrize("where", ["before the command", "after it", "-v at the end"])
def test_verbose_adds_the_traceback_before_the_one_line(monkeypatch, capsys, write_params, where):
    """`recsys train ... --verbose` was refused ("No such option: --verbose"): the flag is taken anywhere."""
    monkeypatch.setenv("RECSYS_VERBOSE", "0")  # restored after the test: --verbose sets it for the stages
    args = ["train", "--model", "nosuch", "--params", str(write_params())]
    args = {"before the command": ["--verbose", *args], "after it": ["train", "--verbose", *args[1:]],
            "-v at the end": [*args, "-v"]}[where]
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 1
    assert "Traceback (most recent call last)" in err
    assert err.strip().splitlines()[-1].startswith("error: unknown model 'nosuch'")


@pytest.mark.parametrize("args, usage, paragraph", [
    ([], "Usage: recsys [OPTIONS] COMMAND [ARGS]...",
     "print one clear line and exit 1 — no traceback unless `--verbose` (`recsys --verbose COMMAND ...`) asks"),
    (["bootstrap"], "Usage: recsys bootstrap [OPTIONS]",
     "generate the default dataset and version it) and write each model's warm source"),
    (["ingest"], "Usage: recsys ingest [OPTIONS] [paths]...",
     "as the ingest flow does; print what happened. Exit code 1 if any batch was rejected"),
    (["recommend"], "Usage: recsys recommend [OPTIONS]", "saying who answered and why."),
    (["registry", "promote"], "Usage: recsys registry promote [OPTIONS]",
     "the same lineage, the baseline installed as champion while no model has passed the gate"),
])
def test_help_names_no_sub_command_a_command_lacks_and_keeps_each_paragraph_whole(monkeypatch, capsys, args,
                                                                                    usage, paragraph):
    """`ingest` and `recommend` are commands, not groups (no `COMMAND [ARGS]...` to look for), and a docstring's
    line breaks do not reach the terminal, which wraps the text itself (wide enough, a paragraph is a line)."""
    monkeypatch.setenv("COLUMNS", "400")
    code, out, _ = run_cli(monkeypatch, capsys, *args, "--help")
    assert code == 0
    lines = [line.strip(" │") for line in out.splitlines()]
    assert next(line for line in lines if line.startswith("Usage: ")) == usage  # `recsys`, however started
    assert any(paragraph in line for line in lines), out


@pytest.mark.parametrize("index, shown", [("0", "got 0"), ("357", "got 357"), ("-1", "got -1"),
                                          ("99999999999", "got 99,999,999,999"),
                                          # 19 digits and past int()'s 4,300 (a traceback before)
                                          ("1" * 19, "got a number of 19 digits"),
                                          ("9" * 5000, "got a number of 5,000 digits"),
                                          ("-" + "9" * 5000, "got a number of 5,000 digits")],
                         ids=["0", "357", "-1", "11 digits", "19 digits", "5000 digits", "-5000 digits"])
def test_data_batch_refuses_an_index_outside_the_generated_calendar_and_creates_nothing(
        monkeypatch, capsys, tmp_path, write_params, index, shown):
    params = write_params({"generate": {"start": "2024-01-01T00:00:00Z", "days": 180}})
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(monkeypatch, capsys, "data", "batch", "--params", str(params), "--", index)
    assert code == 2  # the command line's own value out of its range: a usage error, as `abc` is
    assert_one_line_error(err, "recsys data batch: Invalid value for 'INDEX': must be between 1 and 356",
                          "generate.days = 180", shown, "(see 'recsys data batch --help')")
    assert not (tmp_path / "inbox").exists()  # the inbox was created before the refusal
    code, out, _ = run_cli(monkeypatch, capsys, "data", "batch", "356", "--params", str(params))
    assert code == 0 and (tmp_path / "inbox" / "generated-0356.csv").is_file(), out


@pytest.mark.parametrize("command, out, says", [
    (["data", "generate"], "", "empty: name a folder"),
    (["data", "generate"], "a-file", "a-file is a file: name a folder"),
    (["data", "import", "table", "t.csv"], "", "empty: name a folder"),
    (["data", "batch", "2"], "", "empty: name a file"),
    (["data", "batch", "2"], "inbox", "inbox is a folder: name a file in it"),
    (["data", "batch", "2"], "a-file/b.csv", "its folder a-file is a file"),
    # a file further up was a NotADirectoryError traceback
    (["data", "batch", "2"], "a-file/x/b.csv", "a-file is a file where a folder of a-file/x goes"),
    (["data", "generate"], "a-file/sub", "a-file is a file where a folder of a-file/sub goes"),
    (["data", "import", "table", "t.csv"], "a-file/x/store", "a-file is a file where a folder of a-file/x/store goes"),
])
def test_a_bad_out_is_refused_before_anything_is_written(monkeypatch, capsys, tmp_path, write_params,
                                                        command, out, says):
    """`--out ""` was the current folder (a store written into the repository root); a file or a folder where
    the other is wanted was a traceback."""
    params = write_params({})
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inbox").mkdir()
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "t.csv").write_text("user_id,item_id,timestamp\na,b,1000000000\n")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    code, _, err = run_cli(monkeypatch, capsys, *command, "--out", out, "--params", str(params))
    assert code == 2
    prog = "recsys " + " ".join(command[:2])
    assert_one_line_error(err, f"{prog}: Invalid value for '--out': {says} (see '{prog} --help')")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("seed", [0, 2**32 - 1])
def test_data_batch_writes_its_file_whole(monkeypatch, capsys, tmp_path, write_params, seed):
    """(A generate.seed near the top of its range gave a later batch a seed past it: refused, naming a value
    nobody wrote.)"""
    params = write_params({"generate": {"seed": seed}})
    target = tmp_path / "new" / "b.csv"
    code, out, _ = run_cli(monkeypatch, capsys, "data", "batch", "2", "--out", str(target), "--params",
                           str(params))
    assert code == 0 and out.startswith("wrote ") and str(target) in out
    assert sorted(p.name for p in target.parent.iterdir()) == ["b.csv"]  # no temp file beside it
    assert target.read_text().startswith("user_id,item_id,timestamp")


def test_data_batch_writes_into_the_inbox_of_its_params_file(monkeypatch, capsys, tmp_path, write_params):
    """Run from another folder with `--params /other/repo/params.yaml`, it wrote into the current folder's
    inbox/, which that repository's `recsys ingest` never reads."""
    (tmp_path / "repo").mkdir()
    params = write_params({"ingest": {"inbox": "incoming"}}, tmp_path / "repo" / "params.yaml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, out, _ = run_cli(monkeypatch, capsys, "data", "batch", "2", "--params", str(params))
    target = tmp_path / "repo" / "incoming" / "generated-0002.csv"
    assert code == 0 and out.startswith("wrote ") and out.rstrip().endswith(f" to {target}"), out
    assert target.is_file() and list(elsewhere.iterdir()) == []
    monkeypatch.chdir(tmp_path / "repo")  # from the repository itself, said as before
    code, out, _ = run_cli(monkeypatch, capsys, "data", "batch", "3", "--params", "params.yaml")
    assert code == 0 and out.rstrip().endswith(" to incoming/generated-0003.csv"), out


def test_the_stage_commands_work_in_the_repository_of_their_params_file(monkeypatch, capsys, tmp_path,
                                                                         write_params, tiny_generated):
    """From another folder, `recsys prepare --params /other/repo/params.yaml` recovered that repository's
    ingest but read the current folder's data/ ("no interactions in the raw store data/: run `recsys
    bootstrap` first"); train and evaluate read and wrote the current folder's artifacts/
    ("artifacts/prepared is not a prepared dataset"). The params file's folder is the root, as for `data
    batch`, `ingest` and `warm`."""
    import json

    from recsys.data import write_store
    from recsys.prepare import load

    repo = tmp_path / "repo"
    repo.mkdir()
    params = write_params({"models": ["mostpop"]}, repo / "params.yaml")
    write_store(tiny_generated, repo / "data")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    model = ["--model", "mostpop"]
    for command, given in [(["prepare"], str(params)), (["train", *model], "../repo/params.yaml"),
                           (["evaluate", *model], str(params))]:
        code, _, err = run_cli(monkeypatch, capsys, *command, "--params", given)
        assert code == 0, err
    assert list(elsewhere.iterdir()) == []
    prepared = load(repo / "artifacts" / "prepared").fingerprint
    assert (repo / "artifacts" / "models" / "mostpop" / "model.json").is_file()
    assert json.loads((repo / "metrics" / "mostpop.json").read_text())["n_users"] == prepared["n_test"]


def test_data_generate_and_import_write_the_store_of_their_params_files_repository(monkeypatch, capsys, tmp_path,
                                                                                   write_params):
    """Without --out, both wrote data/ in the current folder, whatever repository --params named."""
    repo = tmp_path / "repo"
    repo.mkdir()
    params = write_params({}, repo / "params.yaml")
    table = tmp_path / "t.csv"
    table.write_text("user_id,item_id,timestamp\n" + "".join(f"u{u},i{i},{1_700_000_000 + 10 * i}\n"
                                                             for u in range(6) for i in range(6)))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, out, err = run_cli(monkeypatch, capsys, "data", "generate", "--params", "../repo/params.yaml")
    assert code == 0 and str(repo / "data") in out, err
    code, out, err = run_cli(monkeypatch, capsys, "data", "import", "table", str(table), "--params", str(params))
    assert code == 0, err
    assert list(elsewhere.iterdir()) == [] and (repo / "data").is_dir()
    monkeypatch.chdir(repo)  # inside it, said as before
    code, out, err = run_cli(monkeypatch, capsys, "data", "generate")
    assert code == 0 and "wrote data/" in out, (out, err)


@pytest.mark.parametrize("source", ["movielens-100k", "movielens-1m"])
def test_data_import_refuses_a_column_mapping_for_movielens(monkeypatch, capsys, tmp_path, write_params,
                                                           source):
    """`--column` was ignored for the MovieLens sources, even malformed: exit 0, the mapping never applied."""
    params = write_params({})
    ml = tmp_path / "ml"
    ml.mkdir()
    (ml / "u.data").write_text("196\t242\t3\t881250949\n186\t302\t3\t891717742\n")
    (ml / "ratings.dat").write_text("1::1193::5::978300760\n2::661::3::978302109\n")
    code, out, err = run_cli(monkeypatch, capsys, "data", "import", source, str(ml), "--out",
                             str(tmp_path / "out"), "--column", "user_id=nonsense", "--column", "bogus",
                             "--params", str(params))
    assert code == 2 and out == ""
    assert_one_line_error(err, f"recsys data import: Invalid value for '--column': 'user_id=nonsense': a "
                               f"column mapping is for `table` only; {source} has fixed columns (leave "
                               "--column out) (see 'recsys data import --help')")
    assert not (tmp_path / "out").exists()


def test_warm_refuses_a_model_params_yaml_does_not_list_and_writes_nothing(monkeypatch, capsys, tmp_path,
                                                                          write_params):
    params = write_params({})
    code, _, err = run_cli(monkeypatch, capsys, "warm", "--model", "nosuch", "--params", str(params))
    assert code == 1
    assert_one_line_error(err, "model(s) ['nosuch'] are not in params.yaml `models`")
    assert not (tmp_path / "artifacts").exists() and not (tmp_path / ".ingest").exists()


@pytest.mark.parametrize("option", ["user_id", "bogus=customer", "user_id=", "=customer"])
def test_data_import_refuses_a_column_mapping_it_cannot_follow(monkeypatch, capsys, tmp_path, option):
    """`--column user_id` (no `=`) was dropped silently; `bogus=customer` renamed a column to bogus."""
    table = tmp_path / "t.csv"
    table.write_text("customer,sku,ts\na,b,1000000000\n")
    code, _, err = run_cli(monkeypatch, capsys, "data", "import", "table", str(table),
                           "--out", str(tmp_path / "out"), "--column", option)
    assert code == 2  # a command line that does not parse
    assert_one_line_error(err, f"recsys data import: Invalid value for '--column': {option!r}: use "
                               "canonical=source", "user_id, item_id, timestamp",
                          "(see 'recsys data import --help')")
    assert not (tmp_path / "out").exists()


def test_data_import_refuses_an_unknown_source_as_a_usage_error(monkeypatch, capsys, tmp_path):
    """It was exit 1 after reading params.yaml, with no word of the help."""
    code, _, err = run_cli(monkeypatch, capsys, "data", "import", "movelens-1m", str(tmp_path), "--out",
                           str(tmp_path / "out"), "--params", str(tmp_path / "absent.yaml"))
    assert code == 2
    assert_one_line_error(err, "recsys data import: Invalid value for 'SOURCE': 'movelens-1m' is not one of "
                               "movielens-1m | movielens-100k | table (see 'recsys data import --help')")
    assert not (tmp_path / "out").exists()


def test_data_import_refuses_one_source_column_read_as_two(monkeypatch, capsys, tmp_path):
    """It said "missing required column(s) ['user_id']", blaming the file."""
    table = tmp_path / "t.csv"
    table.write_text("customer,sku,ts\na,b,1000000000\n")
    code, _, err = run_cli(monkeypatch, capsys, "data", "import", "table", str(table), "--out",
                           str(tmp_path / "out"), "--column", "user_id=customer",
                           "--column", "item_id=customer")
    assert code == 2
    assert_one_line_error(err, "recsys data import: Invalid value for '--column': one source column cannot "
                               "be two canonical ones: {'customer': ['item_id', 'user_id']}")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("options, says", [
    (["user_id=item_id"], ("column mapping {'user_id': 'item_id'} renames a column to user_id, which the "
                           "file already has as a column of its own (columns are ['user_id', 'item_id', "
                           "'timestamp']): map that column too, or name another source")),
    (["user_id=uid"], ("column mapping {'user_id': 'uid'} names column(s) not in the file (columns are "
                       "['user_id', 'item_id', 'timestamp'])")),
])
def test_data_import_says_when_the_mapping_does_not_fit_the_file(monkeypatch, capsys, tmp_path, options,
                                                                 says):
    """`--column user_id=item_id` on a file that has its own user_id said "missing required column(s)
    ['item_id']", not that the mapping had shadowed a column; ingest's column_mapping says the same."""
    table = tmp_path / "t.csv"
    table.write_text("user_id,item_id,timestamp\na,b,1000000000\n")
    code, _, err = run_cli(monkeypatch, capsys, "data", "import", "table", str(table), "--out",
                           str(tmp_path / "out"), *[a for option in options for a in ("--column", option)])
    assert code == 1
    assert_one_line_error(err, f"error: {table}: {says}")
    assert not (tmp_path / "out").exists()
    import pandas as pd

    from recsys.config import IngestConfig
    from recsys.ingest.errors import BatchRejected
    from recsys.ingest.read import map_columns

    mapping = dict(option.split("=") for option in options)
    with pytest.raises(BatchRejected) as rejected:
        map_columns(pd.read_csv(table, dtype=str), IngestConfig(column_mapping=mapping), "t.csv")
    assert str(rejected.value) == f"t.csv: {says}"


def test_the_demo_script_takes_no_arguments(tmp_path):
    """`bash scripts/demo.sh --help` ran the whole demo (setup, training every model)."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run(["bash", str(repo / "scripts" / "demo.sh"), "--help"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and done.stderr.startswith("usage: bash scripts/demo.sh"), done.stderr
    assert list(tmp_path.iterdir()) == []


def test_warm_says_each_line_once(tmp_path, write_params):
    """Each warm source line came twice: the command's own, and the same as an `INFO recsys.warm_source:`
    log record (so did the registry's records of what promote and rollback print)."""
    params = write_params({})
    done = subprocess.run([sys.executable, "-m", "recsys.cli", "warm", "--params", str(params)],
                          capture_output=True, text=True, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    said = [line for line in (done.stdout + done.stderr).splitlines() if "warm source" in line]
    assert said and all(line.startswith("warm source ") for line in said), said
    assert len(said) == len(set(said)) == len(yaml.safe_load(params.read_text())["models"]), said


@pytest.mark.parametrize(("args", "says"), [
    (["recommend", "--user", "a", "--user", "b"], "recsys recommend: --user given twice: give it once"),
    (["registry", "history", "-n", "2", "--limit=3"], "recsys registry history: --limit given twice (also as -n)"),
    (["data", "generate", "--out", "a", "--out=b"], "recsys data generate: --out given twice: give it once"),
    (["recommend", "-k5", "--user", "u", "-k", "6"], "recsys recommend: -k given twice: give it once"),
    (["-v", "train", "--verbose"], "recsys train: --verbose given twice (also as -v)"),
    (["train", "-v", "-v"], "recsys train: -v given twice: give it once"),
])
def test_an_option_given_twice_is_refused_before_anything_runs(monkeypatch, capsys, tmp_path, args, says):
    """Click keeps the last of them without a word (`--user a --user b` recommended for b)."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2 and out == ""
    assert_one_line_error(err, says)
    assert list(tmp_path.iterdir()) == []


def test_an_option_value_that_looks_like_an_option_is_a_value(monkeypatch, capsys, tmp_path):
    """Click takes the word after `--user` as its value whatever it looks like: `--user -k -k 3` gives -k once."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(monkeypatch, capsys, "recommend", "--user", "-k", "-k", "3")
    assert code == 1 and "given twice" not in err and "params file not found" in err, err


def test_options_meant_to_repeat_still_repeat(monkeypatch, capsys, tmp_path):
    """`--column` is given once a column: both parse (the refusal here is the command's own, past parsing)."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(monkeypatch, capsys, "data", "import", "table", str(tmp_path / "absent.csv"),
                             "--column", "user_id=customer", "--column", "item_id=sku")
    assert code == 1 and "given twice" not in err and "params file not found" in err, err


def test_a_generated_batch_never_replaces_another_file(monkeypatch, capsys, tmp_path, write_params):
    """`recsys data batch 1 --out params.yaml` replaced the repository's settings with CSV rows (exit 0). A file
    with other bytes is now kept and the command refused in one line; the same batch again is a no-op."""
    params = write_params()
    before = params.read_bytes()
    code, out, err = run_cli(monkeypatch, capsys, "data", "batch", "1", "--out", str(params), "--params",
                             str(params))
    assert (code, out) == (1, "")
    assert_one_line_error(err, f"error: {params} exists with other contents: `recsys data batch` never replaces a "
                               "file; name a new one with --out, or move that one away")
    assert params.read_bytes() == before
    batch = tmp_path / "batch.csv"
    for _ in range(2):  # written, then the same bytes again
        code, out, _ = run_cli(monkeypatch, capsys, "data", "batch", "1", "--out", str(batch), "--params",
                               str(params))
        assert code == 0 and out.startswith("wrote ")


@pytest.mark.parametrize("command, out, place", [
    (["data", "batch", "1"], "data/interactions/part-9999999999.parquet",
     "lies in data/, the raw store data.dvc versions"),
    (["data", "batch", "1"], ".ingest/x.csv", "lies in .ingest/, ingest's state and locks"),
    (["data", "generate"], "registry", "is registry/, the model registry"),
    (["data", "generate"], "artifacts/prepared", "lies in artifacts/, the pipeline's outputs"),
    (["data", "generate"], ".git", "is .git/, git's repository"),
    (["data", "import", "table", "t.csv"], ".dvc/cache", "lies in .dvc/, DVC's cache and configuration"),
    # a seed in the inbox is taken for batches; a batch in a filing folder is one no run reads
    (["data", "generate"], "inbox", "is the inbox (ingest.inbox), whose files are batches"),
    (["data", "batch", "1"], "inbox/processed/generated-0001.csv",
     "lies in the inbox's processed/, where ingest files the batches it has read"),
])
def test_an_out_in_a_folder_the_system_writes_is_refused_before_anything_is_written(
        monkeypatch, capsys, tmp_path, write_params, command, out, place):
    """A CSV planted as a store part broke the next ingest; a seed was written into the registry's, git's or
    the prepare stage's folders. Refused as a command line that does not parse (exit 2), as `--inbox` there is."""
    params = write_params()
    monkeypatch.chdir(tmp_path)
    code, printed, err = run_cli(monkeypatch, capsys, *command, "--out", out, "--params", str(params))
    assert (code, printed) == (2, "")
    assert_one_line_error(err, f"{out} {place}")
    assert not (tmp_path / out).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_a_batch_dated_after_now_says_ingest_will_reject_it(monkeypatch, capsys, tmp_path, write_params):
    """`recsys data batch 6` (the default dataset's, dated from 2026-12) was written without a word and then
    rejected whole by ingest: every row too far in the future. Still written (it becomes ingestible in
    time), with one warning line naming the setting; batch 1 (2024) has none."""
    params = write_params()
    code, out, err = run_cli(monkeypatch, capsys, "data", "batch", "300", "--out", str(tmp_path / "late.csv"),
                             "--params", str(params))
    assert code == 0 and out.startswith("wrote ") and (tmp_path / "late.csv").is_file()
    assert err.count("\n") == 1 and err.startswith("warning: ") and "are dated after now + " in err
    assert "ingest.max_future_skew_seconds (86400)" in err and "take an earlier batch than 300" in err, err
    code, _, err = run_cli(monkeypatch, capsys, "data", "batch", "1", "--out", str(tmp_path / "early.csv"),
                           "--params", str(params))
    assert code == 0 and err == ""


def test_a_mapping_from_params_yaml_that_does_not_fit_says_where_it_came_from(monkeypatch, capsys, tmp_path,
                                                                              write_params):
    """A seed already in canonical columns, in a repository that maps later batches' columns: the refusal
    named a mapping the command line never gave."""
    source = tmp_path / "events.csv"
    source.write_text("user_id,item_id,timestamp\na,x,1704067210\n")
    params = write_params({"ingest": {"column_mapping": {"user_id": "customer", "item_id": "sku",
                                                         "timestamp": "ts"}}})
    code, _, err = run_cli(monkeypatch, capsys, "data", "import", "table", str(source), "--out",
                           str(tmp_path / "data"), "--params", str(params))
    assert code == 1
    assert_one_line_error(err, "names column(s) not in the file", "(the mapping is params.yaml's "
                               "ingest.column_mapping; --column options replace it)")
