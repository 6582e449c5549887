"""Strict command-line input for the registry: version arguments, and database failures as one line
(SQLite and PostgreSQL) — never a traceback or SQL text."""

from __future__ import annotations

import pytest
from pg import pg_server, pg_url  # noqa: F401  (fixtures)
from sqlalchemy import create_engine, text
from test_registry_cli import MOSTPOP, invoke, open_from
from test_registry_support import make_checkpoint, make_eval

from recsys.commands.registry import MAX_VERSION
from recsys.commands.registry import app as registry_app

BAD_VERSIONS = ["1.0", " 1", "1 ", "+1", "0", "-1", "01", "1e3", "", "٣", "99999999999999999999",
                str(MAX_VERSION + 1)]


def write_params(root, url: str = "sqlite:///registry/registry.db"):  # type: ignore[no-untyped-def]
    path = root / "params.yaml"
    path.write_text(f"models: [mostpop]\nregistry:\n  url: {url}\n  artifact_root: registry/artifacts\n")
    return path


def one_line(result) -> str:  # type: ignore[no-untyped-def]
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: ") and "Traceback" not in result.output
    for sql in ("SELECT", "INSERT", "[SQL", "Background on this error", "sqlalche.me"):
        assert sql not in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("bad", BAD_VERSIONS)
@pytest.mark.parametrize("command", [("show",), ("rollback", "--to")])
def test_version_arguments_are_parsed_strictly(tmp_path, command, bad):
    params_path = write_params(tmp_path)
    result = invoke(registry_app, *command, bad, "--params", str(params_path))
    assert result.exit_code == 2
    line = one_line(result)
    assert repr(bad) in line and "not a version number" in line
    prog = "recsys registry " + command[0]
    assert line.startswith(f"error: {prog}: ") and line.endswith(f"(see '{prog} --help')"), line
    assert not (tmp_path / "registry").exists()  # refused before the registry was even opened


@pytest.mark.parametrize("setting", ["README.md", "README.md/artifacts"])
@pytest.mark.parametrize("command", [("list",), ("history",), ("show", "1")])
def test_an_artifact_root_that_is_a_file_is_one_line_naming_the_setting(tmp_path, setting, command):
    """It was 'error: [Errno 20] Not a directory: '/…/README.md/tmp'' once a checkpoint was stored, naming no
    setting; now every command that opens the registry refuses it, before the database is made."""
    (tmp_path / "README.md").write_text("# a file\n")
    params_path = write_params(tmp_path)
    params_path.write_text(params_path.read_text().replace("registry/artifacts", setting))
    result = invoke(registry_app, *command, "--params", str(params_path))
    assert result.exit_code == 1
    assert one_line(result) == (f"error: registry.artifact_root {setting!r} is not a folder: "
                                f"{tmp_path / 'README.md'} is a file; point registry.artifact_root at a "
                                "folder (or one to create) in params.yaml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "params.yaml"]  # no registry made


def test_a_promotion_into_an_artifact_root_that_is_a_file_is_refused_before_anything_is_written(tmp_path):
    import dataclasses

    from test_registry_support import registry_config

    from recsys.config import ConfigError
    from recsys.registry import open_registry

    (tmp_path / "README.md").write_text("# a file\n")
    config = dataclasses.replace(registry_config(tmp_path), artifact_root=str(tmp_path / "README.md"))
    with pytest.raises(ConfigError, match=r"^registry\.artifact_root '.*README\.md' is not a folder"):
        open_registry(config, tmp_path)  # (its promote failed with NotADirectoryError: …/README.md/tmp)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md"]


def _promote_two(params_path, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with open_from(params_path) as reg:
        for i, shift in enumerate([0.0, 0.05], start=1):
            ckpt = make_checkpoint(tmp_path / "ckpts", f"v{i}")
            assert reg.promote(ckpt, make_eval(shift, seed=i), baseline_result=MOSTPOP,
                               baseline_kind="mostpop").promoted


def check_largest_version(params_path, tmp_path) -> None:  # type: ignore[no-untyped-def]
    empty = invoke(registry_app, "show", "1", "--params", str(params_path))
    assert one_line(empty).endswith("does not exist (the registry holds no versions yet)")
    _promote_two(params_path, tmp_path)
    largest = str(MAX_VERSION)
    held = "(the registry holds versions 1–2; `recsys registry list` shows them)"
    shown = invoke(registry_app, "show", largest, "--params", str(params_path))
    assert shown.exit_code == 1
    assert one_line(shown) == f"error: version {largest} of model 'next_item' does not exist {held}"
    rolled = invoke(registry_app, "rollback", "--to", largest, "--params", str(params_path))
    assert rolled.exit_code == 1 and one_line(rolled).endswith(f"version {largest} does not exist {held}")
    assert invoke(registry_app, "show", "2", "--params", str(params_path)).exit_code == 0
    assert invoke(registry_app, "rollback", "--to", "1", "--params", str(params_path)).exit_code == 0


def test_the_largest_version_reaches_sqlite_and_is_simply_not_found(tmp_path):
    check_largest_version(write_params(tmp_path), tmp_path)


@pytest.mark.postgres
def test_the_largest_version_reaches_postgresql_and_is_simply_not_found(tmp_path, pg_url):  # noqa: F811
    check_largest_version(write_params(tmp_path, pg_url), tmp_path)


COMMANDS = [(("show", "3"), "cannot show version 3"), (("list",), "cannot list versions"),
            (("history",), "cannot read the promotion history"),
            (("rollback", "--to", "2"), "cannot roll back to version 2"),
                    (("promote", "--model", "sasrec"), "cannot promote 'sasrec'")]


@pytest.mark.parametrize("args, doing", COMMANDS)
def test_a_broken_sqlite_database_is_one_line_naming_the_input(tmp_path, args, doing):
    params_path = write_params(tmp_path)
    (tmp_path / "registry").mkdir()
    (tmp_path / "registry" / "registry.db").write_bytes(b"this is not a database" * 100)
    if args[0] == "promote":
        from test_registry_cli import _write_stage_outputs

        _write_stage_outputs(tmp_path, "sasrec", make_eval(0.0), b"weights")
    result = invoke(registry_app, *args, "--params", str(params_path))
    assert result.exit_code == 1
    line = one_line(result)
    assert line.startswith(f"error: {doing}: the registry database failed") and "not a database" in line
    assert not (tmp_path / "registry" / "artifacts" / "sha256").exists()  # nothing copied for a broken registry


@pytest.mark.postgres
def test_postgresql_failures_are_one_line_naming_the_input(tmp_path, pg_server, pg_url):  # noqa: F811
    params_path = write_params(tmp_path, pg_url)
    _promote_two(params_path, tmp_path)
    with open_from(params_path) as reg, reg.engine.begin() as conn:
        conn.execute(text("DROP TABLE evaluations"))
        conn.execute(text("ALTER TABLE model_versions RENAME TO model_versions_gone"))
    shown = invoke(registry_app, "show", "2", "--params", str(params_path))
    line = one_line(shown)
    assert shown.exit_code == 1 and line.startswith("error: cannot show version 2: the registry database failed")
    assert 'relation "model_versions" does not exist' in line

    (tmp_path / "gone").mkdir()
    gone = write_params(tmp_path / "gone", pg_server.url("no_such_database"))
    listed = invoke(registry_app, "list", "--params", str(gone))
    line = one_line(listed)
    assert listed.exit_code == 1 and line.startswith("error: cannot list versions: the registry database failed")
    assert "no_such_database" in line


BAD_COUNTS = ["1.0", " 3", "2 ", "+2", "1_0", "0", "-1", "01", "1e3", "", "٣", str(MAX_VERSION + 1)]


@pytest.mark.parametrize("bad", BAD_COUNTS)
def test_history_limit_is_parsed_strictly(tmp_path, bad):
    """`-n 9223372036854775808` was an OverflowError traceback from SQLite; "1.0" and "+2" were taken."""
    params_path = write_params(tmp_path)
    result = invoke(registry_app, "history", "-n", bad, "--params", str(params_path))
    assert result.exit_code == 2
    assert one_line(result) == (f"error: recsys registry history: --limit {bad!r} is not a whole number from 1 "
                                f"to {MAX_VERSION} (see 'recsys registry history --help')")
    assert not (tmp_path / "registry").exists()  # refused before the registry was even opened
    largest = invoke(registry_app, "history", "-n", str(MAX_VERSION), "--params", str(params_path))
    assert largest.exit_code == 0 and "no promotion events yet" in largest.output


@pytest.mark.parametrize("args", [("list",), ("history",), ("show", "1")])
def test_a_registry_migrated_by_a_newer_recsys_is_one_line(tmp_path, args):
    """A shared registry a colleague's newer recsys migrated: Alembic's "Can't locate revision" traceback was
    all every command said; this code must neither read nor write that schema."""
    from recsys.registry.db import VERSION_TABLE

    params_path = write_params(tmp_path)
    with open_from(params_path) as reg, reg.engine.begin() as conn:
        conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = :rev"), {"rev": "0099_future"})
    result = invoke(registry_app, *args, "--params", str(params_path))
    assert result.exit_code == 1
    line = one_line(result)
    assert "'0099_future', which this recsys does not know" in line and "upgrade recsys" in line, line
    engine = create_engine(f"sqlite:///{tmp_path / 'registry' / 'registry.db'}")
    with engine.connect() as conn:  # left as it was: no downgrade, no write
        assert conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar() == "0099_future"
    engine.dispose()
