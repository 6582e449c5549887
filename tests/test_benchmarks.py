"""The benchmark's names for runs stay true to params.yaml (the RESULTS tables are read through them)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import curves  # noqa: E402
from bench_models import configs_for  # noqa: E402

from recsys.config import load_params  # noqa: E402


def test_the_default_sasrec_run_is_what_params_yaml_trains():
    params = load_params(ROOT / "params.yaml")
    assert configs_for(curves.SASREC_DEFAULT_RUN, params) == configs_for("sasrec", params)


def test_every_ablation_row_names_a_run_that_parses_and_a_base_in_the_table():
    params = load_params(ROOT / "params.yaml")
    runs = {run for run, _, _ in curves.ABLATION}
    for run, base, change in curves.ABLATION:
        configs_for(run, params)  # raises SystemExit on an unknown key
        assert base is None or base in runs, base
        assert change
