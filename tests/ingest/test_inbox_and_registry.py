"""An inbox may not be, lie in or hold the model registry where params.yaml puts it (`registry.artifact_root`,
a SQLite `registry.url`, `RECSYS_REGISTRY_URL`), not only at its default place: a run would take every
checkpoint file there for a batch and move it into `rejected/`. Real files; `check_inbox` is what every run
(the CLI, both flows) calls before anything is locked or moved."""

from __future__ import annotations

import pytest
import yaml

from recsys.config import ConfigError, IngestConfig
from recsys.ingest.layout import check_inbox
from recsys.ingest.layout import paths as ingest_paths


def checked(root, inbox: str, registry: dict | None):
    (root / inbox).mkdir(parents=True, exist_ok=True)
    (root / "params.yaml").write_text(yaml.safe_dump({"ingest": {"inbox": inbox},
                                                      **({"registry": registry} if registry else {})}))
    config = IngestConfig(inbox=inbox)
    return check_inbox(ingest_paths(root, config), config)


@pytest.mark.parametrize("inbox, registry, says", [
    ("models/store", {"artifact_root": "models/store"},
     "is models/store/, the model registry's artifacts (registry.artifact_root)"),
    ("models", {"artifact_root": "models/store"},
     "holds models/store/, the model registry's artifacts (registry.artifact_root)"),
    ("models/store/inbox", {"artifact_root": "models/store"},
     "lies in models/store/, the model registry's artifacts (registry.artifact_root)"),
    ("db", {"url": "sqlite:///db/registry.db"},
     "holds db/registry.db, the model registry's database (registry.url)"),
])
def test_an_inbox_at_the_registry_params_yaml_names_is_refused(tmp_path, inbox, registry, says):
    with pytest.raises(ConfigError) as refused:
        checked(tmp_path, inbox, registry)
    assert f"inbox {(tmp_path / inbox).resolve()} {says}: a run would take every file there" in str(refused.value)


def test_the_registry_outside_the_repository_and_the_environments_url_count_too(tmp_path, monkeypatch):
    root, elsewhere = tmp_path / "repo", tmp_path / "shared"
    root.mkdir()
    with pytest.raises(ConfigError, match="the model registry's artifacts"):
        checked(root, str(elsewhere / "artifacts"), {"artifact_root": str(elsewhere / "artifacts")})
    monkeypatch.setenv("RECSYS_REGISTRY_URL", f"sqlite:///{elsewhere / 'db' / 'registry.db'}")
    with pytest.raises(ConfigError, match="the model registry's database"):
        checked(root, str(elsewhere / "db"), None)


@pytest.mark.parametrize("registry", [
    {"artifact_root": "models/store", "url": "sqlite:///models/registry.db"},
    {"url": "postgresql+psycopg://user@db.internal/registry", "artifact_root": "s3://bucket/artifacts"},
    {"url": ["not", "a", "string"]},  # refused by whatever opens the registry, not by ingest
])
def test_an_inbox_beside_the_registry_is_an_inbox(tmp_path, registry):
    where = checked(tmp_path, "inbox", registry)
    assert where.inbox == (tmp_path / "inbox").resolve()


def test_the_params_file_the_run_reads_places_the_registry_not_the_repositorys(tmp_path):
    """`recsys ingest --params staging.yaml`: that file's registry section counts. Here params.yaml keeps the
    registry at its default and staging.yaml puts its artifacts in `shelf/`, the inbox the run is given."""
    from typer.testing import CliRunner

    from recsys.commands.ingest import app

    (tmp_path / "shelf").mkdir()
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"ingest": {"inbox": "shelf"}}))
    staging = tmp_path / "staging.yaml"
    staging.write_text(yaml.safe_dump({"ingest": {"inbox": "shelf"}, "registry": {"artifact_root": "shelf"}}))
    config = IngestConfig(inbox="shelf")
    assert check_inbox(ingest_paths(tmp_path, config), config).inbox == (tmp_path / "shelf").resolve()
    with pytest.raises(ConfigError, match="is shelf/, the model registry's artifacts"):
        check_inbox(ingest_paths(tmp_path, config, params=staging), config)
    (tmp_path / "shelf" / "model.safetensors").write_text("not a batch")
    result = CliRunner().invoke(app, ["--params", str(staging)])
    assert result.exit_code == 1
    assert "is shelf/, the model registry's artifacts (registry.artifact_root)" in result.output
    assert "set ingest.inbox in staging.yaml (or --inbox)" in result.output  # the file the run was given
    assert (tmp_path / "shelf" / "model.safetensors").is_file()  # not taken for a batch, not moved
