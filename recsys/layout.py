"""Where every stage reads and writes, relative to the repository root: the one home of the pipeline layout.

`dvc.yaml` is rendered from these names (`python -m recsys.dvc_graph`, checked by a test), the stages'
`main()`s, the flows, the CLI and the tests all ask here, so a path is spelled once.

    layout = Layout(root)
    layout.model_dir("sasrec")      # <root>/artifacts/models/sasrec
    MODEL_DIR.format(model="sasrec") # artifacts/models/sasrec (what dvc.yaml says)
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

# Relative to the repository root. `{model}` is filled with a model name from params.yaml `models`.
PARAMS = "params.yaml"  # the one params file: dvc.yaml's `params:` and every stage read it
DATA = "data"  # the raw store (tracked by data.dvc, appended to by ingest)
EXPECTATIONS = "expectations"  # the Great Expectations suites every batch is validated with (recsys.validation)
DATA_DVC = "data.dvc"
PREPARED = "artifacts/prepared"
# In PREPARED, written last: counts, split settings and cuts (recsys/prepare.py; the gate reads its test cut).
PREPARED_FINGERPRINT = "fingerprint.json"
MODEL_DIR = "artifacts/models/{model}"
# The checkpoint a `train.init: warm | auto` run starts from (recsys/warm.py), written before `dvc repro` by
# `recsys warm`, `recsys bootstrap` and the retrain flow; a dependency of train@<model> in dvc.yaml.
WARM_DIR = "artifacts/warm/{model}"
WARM_SOURCE_FILE = "source.json"  # in WARM_DIR: what the warm source is (recsys/warm.py)
EVAL_DIR = "artifacts/eval/{model}"
PER_USER = "artifacts/eval/{model}/per_user.parquet"
METRICS = "metrics/{model}.json"
CURVE = "plots/{model}.csv"
# The metric that selects: early stopping's best epoch, the retrain flow's candidate (recsys/retraining.py),
# on the validation split; and its column in CURVE, which `dvc plots` draws. The gate's metric is gate.metric.
SELECTION_METRIC = "ndcg@10"
VALID_COLUMN = f"valid_{SELECTION_METRIC}"
RESUME = ".resume"  # trainer state after each epoch (git-ignored, outside DVC)
STATE = ".ingest"  # workspace lock, ingest journal, params backup during an --epochs override
SCRATCH = "tmp"  # inside STATE: the temp files of workspace writes, emptied when recovery starts
SEEDING = "seeding"  # inside STATE: `recsys bootstrap` generated a seed store that `dvc add` has not recorded


@dataclass(frozen=True)
class Layout:
    """The layout under one repository root, as absolute-or-relative `Path`s."""

    root: Path = Path(".")

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def params(self) -> Path:
        return self.root / PARAMS

    @property
    def data(self) -> Path:
        return self.root / DATA

    @property
    def data_dvc(self) -> Path:
        return self.root / DATA_DVC

    @property
    def prepared(self) -> Path:
        return self.root / PREPARED

    @property
    def resume(self) -> Path:
        return self.root / RESUME

    @property
    def state(self) -> Path:
        return self.root / STATE

    @property
    def scratch(self) -> Path:
        return self.root / STATE / SCRATCH

    @property
    def seeding(self) -> Path:
        return self.root / STATE / SEEDING

    def model_dir(self, model: str) -> Path:
        return self.root / MODEL_DIR.format(model=model)

    def warm_dir(self, model: str) -> Path:
        return self.root / WARM_DIR.format(model=model)

    def eval_dir(self, model: str) -> Path:
        return self.root / EVAL_DIR.format(model=model)

    def per_user(self, model: str) -> Path:
        return self.root / PER_USER.format(model=model)

    def metrics(self, model: str) -> Path:
        return self.root / METRICS.format(model=model)

    def curve(self, model: str) -> Path:
        return self.root / CURVE.format(model=model)


def resume_dir(resume_root: Path, model: str, run_key: str) -> Path:
    """Where the trainer keeps `model`'s state for one run key (config + data) between epochs."""
    return Path(resume_root) / f"{model}-{run_key}"


def resume_dirs(resume_root: Path, model: str) -> list[Path]:
    """Every resume state of `model` (any run key, and a `.tmp` or `.old` a kill left)."""
    root = Path(resume_root)
    # (not another model whose name extends this one's)
    own = re.compile(re.escape(model) + r"-[0-9a-f]{20}(\.tmp|\.old)?")
    return sorted(p for p in root.glob(f"{model}-*") if own.fullmatch(p.name)) if root.is_dir() else []


def prune_resume_state(resume_root: Path, models: list[str]) -> list[Path]:
    """Remove the resume state of `models`, whose outputs are complete. Called after a successful `dvc repro`
    of them: a stage DVC restored from its cache never ran, so nothing else would clear its old state."""
    removed = [path for model in models for path in resume_dirs(resume_root, model)]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed
