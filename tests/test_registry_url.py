"""Where the registry is: params.yaml's `registry.url`, or RECSYS_REGISTRY_URL in its place (so that a
password stays out of the repository) — and a password never shows in a message."""

from __future__ import annotations

import pytest
from pg import pg_server, pg_url  # noqa: F401  (fixtures)
from test_registry_cli import invoke
from test_registry_cli_input import COMMANDS, _promote_two, one_line, write_params
from test_registry_support import make_eval

from recsys.commands.registry import app as registry_app
from recsys.registry import REGISTRY_URL_ENV
from recsys.registry.db import masked_url

SECRET = "S3cr3tPW"


def test_the_environment_s_url_wins_over_params_yaml(tmp_path, monkeypatch):
    from test_registry_cli import _write_stage_outputs

    params_path = write_params(tmp_path)  # registry.url: sqlite:///registry/registry.db
    elsewhere = tmp_path / "elsewhere" / "registry.db"
    monkeypatch.setenv(REGISTRY_URL_ENV, f"sqlite:///{elsewhere}")
    _write_stage_outputs(tmp_path, "mostpop", make_eval(-0.15, seed=7), b"mostpop")  # the baseline
    _write_stage_outputs(tmp_path, "sasrec", make_eval(0.0, seed=8), b"sasrec one")
    promoted = invoke(registry_app, "promote", "--model", "sasrec", "--params", str(params_path))
    assert promoted.exit_code == 0 and promoted.output.startswith("PROMOTED v2 (sasrec)"), promoted.output
    assert elsewhere.is_file() and not (tmp_path / "registry" / "registry.db").exists()
    listed = invoke(registry_app, "list", "--params", str(params_path))
    assert [line.split()[:2] for line in listed.output.splitlines() if line.startswith("*")] == [["*", "2"]]

    monkeypatch.delenv(REGISTRY_URL_ENV)  # params.yaml's registry again: empty, and left uncreated
    unset = invoke(registry_app, "list", "--params", str(params_path))
    assert unset.exit_code == 0 and "no versions registered" in unset.output
    assert not (tmp_path / "registry" / "registry.db").exists()


@pytest.mark.parametrize("value", ["", "  "])
@pytest.mark.parametrize("args, doing", COMMANDS)
def test_an_empty_url_in_the_environment_is_refused_naming_the_variable(tmp_path, monkeypatch, value, args,
                                                                        doing):
    params_path = write_params(tmp_path)
    monkeypatch.setenv(REGISTRY_URL_ENV, value)
    result = invoke(registry_app, *args, "--params", str(params_path))
    assert result.exit_code == 1
    assert one_line(result) == (
        "error: RECSYS_REGISTRY_URL is set but empty: unset it to use params.yaml's registry.url, or set it "
        "to the registry's SQLAlchemy URL (postgresql+psycopg://user:pw@host/db)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]  # no registry made anywhere


BAD_URLS = [
    (f"postgresql+nosuchdriver://recsys:{SECRET}@db.internal/recsys",
     "cannot use 'postgresql+nosuchdriver://recsys:***@db.internal/recsys': Can't load plugin"),
    (f"not a url://recsys:{SECRET}@db.internal/recsys",
     "cannot use 'not a url://recsys:***@db.internal/recsys': Could not parse SQLAlchemy URL"),
    (f"postgresql://recsys:{SECRET}@db.internal:no-port/recsys",
     "cannot use 'postgresql://recsys:***@db.internal:no-port/recsys': invalid literal for int()"),
]


@pytest.mark.parametrize("url, says", BAD_URLS)
@pytest.mark.parametrize("where", ["environment", "params.yaml"])
def test_a_url_that_cannot_be_used_is_refused_without_its_password(tmp_path, monkeypatch, url, says, where):
    """The same check for both settings, each named; the message had the password in clear before."""
    if where == "environment":
        params_path = write_params(tmp_path)
        monkeypatch.setenv(REGISTRY_URL_ENV, url)
    else:
        params_path = write_params(tmp_path, f'"{url}"')
    result = invoke(registry_app, "list", "--params", str(params_path))
    assert result.exit_code == 1
    line = one_line(result)
    setting = "RECSYS_REGISTRY_URL" if where == "environment" else "registry.url"
    assert line.startswith(f"error: {setting}: {says}"), line
    assert SECRET not in result.output


def test_a_database_that_refuses_the_connection_is_named_without_its_password(tmp_path, monkeypatch):
    pytest.importorskip("psycopg")
    params_path = write_params(tmp_path)
    monkeypatch.setenv(REGISTRY_URL_ENV, f"postgresql+psycopg://recsys:{SECRET}@127.0.0.1:1/recsys")
    result = invoke(registry_app, "history", "--params", str(params_path))
    assert result.exit_code == 1
    line = one_line(result)
    assert line.startswith("error: cannot read the promotion history: the registry database failed (registry "
                           "postgresql+psycopg://recsys:***@127.0.0.1:1/recsys): "), line
    assert SECRET not in result.output


@pytest.mark.parametrize("url, shown", [
    ("postgresql+psycopg://recsys:pw@db/recsys", "postgresql+psycopg://recsys:***@db/recsys"),
    ("postgresql+psycopg://recsys:p%40w@db/recsys", "postgresql+psycopg://recsys:***@db/recsys"),
    ("postgresql+psycopg://recsys@db/recsys", "postgresql+psycopg://recsys@db/recsys"),
    ("sqlite:///registry/registry.db", "sqlite:///registry/registry.db"),
    ("no url://recsys:p@w@db/recsys", "no url://recsys:***@db/recsys"),  # unparsable: up to the last @
    ("no url at all", "no url at all"),
    # libpq takes the password as a query parameter too: it was shown as given, in every message and log
    ("postgresql+psycopg://u@db/recsys?password=PW", "postgresql+psycopg://u@db/recsys?password=%2A%2A%2A"),
    ("postgresql://u@db/r?sslmode=require&PassWord=PW", "postgresql://u@db/r?PassWord=%2A%2A%2A&sslmode=require"),
    ("postgresql://u@db:port/r?password=PW", "postgresql://u@db:port/r?password=***"),  # unparsable: the port
])
def test_masked_url(url, shown):
    assert masked_url(url) == shown


@pytest.mark.postgres
def test_a_postgresql_url_with_a_password_from_the_environment(tmp_path, monkeypatch,
                                                               pg_server, pg_url):  # noqa: F811
    """The test server trusts every local connection, so any password is accepted — and must never show."""
    params_path = write_params(tmp_path)
    with_password = pg_url.replace("://postgres@", f"://postgres:{SECRET}@")
    assert with_password != pg_url
    monkeypatch.setenv(REGISTRY_URL_ENV, with_password)
    _promote_two(params_path, tmp_path)
    listed = invoke(registry_app, "list", "--params", str(params_path))
    assert listed.exit_code == 0
    assert [line.lstrip("* ").split()[0] for line in listed.output.splitlines()[1:]] == ["1", "2"]
    assert not (tmp_path / "registry" / "registry.db").exists()  # params.yaml's registry was never made

    monkeypatch.setenv(REGISTRY_URL_ENV, pg_server.url("no_such_database").replace(
        "://postgres@", f"://postgres:{SECRET}@"))
    missing = invoke(registry_app, "list", "--params", str(params_path))
    line = one_line(missing)
    assert missing.exit_code == 1 and "(registry postgresql+psycopg://postgres:***@127.0.0.1:" in line
    assert "no_such_database" in line and SECRET not in missing.output
