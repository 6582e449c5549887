""""A code change re-runs exactly what it affects": in a reproduced copy of the repository, editing a module
marks, in `dvc status`, exactly the stages whose code imports it (dvc.yaml deps come from recsys.dvc_graph)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from flow_support import make_repo, sh, subprocess_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

MODELS = ["mostpop", "sasrec"]
EVERY_STAGE = {"prepare", *(f"{stage}@{m}" for stage in ("train", "evaluate") for m in MODELS)}


def changed_stages(repo: Path) -> set[str]:
    done = subprocess.run(["dvc", "status", "--json"], cwd=repo, env=subprocess_env(), capture_output=True,
                          text=True, timeout=600, check=True)
    return set(json.loads(done.stdout or "{}"))


@pytest.fixture(scope="module")
def reproduced(tmp_path_factory):
    repo = make_repo(tmp_path_factory.mktemp("code-changes") / "repo",
                     {"models": MODELS, "train": {"epochs": 1, "patience": 1}})
    sh(["dvc", "repro"], repo)
    assert changed_stages(repo) == set()
    return repo


@pytest.mark.parametrize("module, expected", [
    ("recsys/evaluate.py", {"evaluate@mostpop", "evaluate@sasrec"}),  # evaluate-only
    ("recsys/train.py", {"train@mostpop", "train@sasrec"}),  # train-only
    ("recsys/prepare.py", EVERY_STAGE),  # everything downstream imports it too
    ("recsys/config.py", EVERY_STAGE),
    ("recsys/registry/core.py", set()),  # no stage imports the registry
])
def test_an_edit_marks_exactly_the_stages_that_import_the_module(reproduced, module, expected):
    path = reproduced / module
    original = path.read_bytes()
    try:
        path.write_bytes(original + b"\n# an edit\n")
        assert changed_stages(reproduced) == expected
    finally:
        path.write_bytes(original)
    assert changed_stages(reproduced) == set()
