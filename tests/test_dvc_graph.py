"""dvc.yaml agrees with recsys/layout.py and lists, per stage, exactly the project modules the stage imports."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

from recsys import layout
from recsys.dvc_graph import code_deps, render

REPO = Path(__file__).resolve().parent.parent


def test_dvc_yaml_is_what_the_layout_and_the_imports_render():
    assert (REPO / "dvc.yaml").read_text(encoding="utf-8") == render(REPO), (
        "dvc.yaml is out of date: run `python -m recsys.dvc_graph`")


def test_stage_paths_come_from_the_layout():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    item = "${item}"
    assert stages["prepare"]["outs"] == [layout.PREPARED]
    assert layout.DATA in stages["prepare"]["deps"]
    assert stages["train"]["do"]["outs"] == [layout.MODEL_DIR.format(model=item)]
    assert list(stages["train"]["do"]["plots"][0]) == [layout.CURVE.format(model=item)]
    assert stages["evaluate"]["do"]["outs"] == [layout.EVAL_DIR.format(model=item)]
    assert stages["evaluate"]["do"]["metrics"] == [layout.METRICS.format(model=item)]
    assert layout.MODEL_DIR.format(model=item) in stages["evaluate"]["do"]["deps"]
    # What a warm start begins from is an input DVC hashes, not registry state the stage looks up.
    assert layout.WARM_DIR.format(model=item) in stages["train"]["do"]["deps"]


def test_every_output_is_cached_so_the_remote_carries_it_to_a_clone():
    """metrics/ and plots/ are git-ignored: with `cache: false` a clone would lack them after `dvc pull` and
    retrain (tests/test_s3_remote.py runs that round trip)."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for name, stage in stages.items():
        body = stage.get("do", stage)
        for kind in ("outs", "metrics", "plots"):
            for entry in body.get(kind, []):
                options = next(iter(entry.values())) if isinstance(entry, dict) else {}
                assert options.get("cache", True), (name, kind, entry)


def test_code_deps_follow_imports_transitively_and_nothing_else():
    prepare, train, evaluate = (set(code_deps(m, REPO)) for m in ("recsys.prepare", "recsys.train",
                                                                     "recsys.evaluate"))
    # Function-level imports count (prepare's main imports the store; the store imports the schema).
    assert {"recsys/prepare.py", "recsys/store.py", "recsys/schema.py", "recsys/__init__.py"} <= prepare
    assert "recsys/ranking.py" in train and "recsys/ranking.py" in evaluate
    assert "recsys/checkpoint.py" in evaluate  # imported inside evaluate_checkpoint
    # The cycle is broken: training never runs the evaluate stage's module, nor evaluation the trainer.
    assert "recsys/evaluate.py" not in train and "recsys/train.py" not in evaluate
    # Nothing the stages never import: the CLI, the registry (nor the warm-source resolver), the flows.
    assert "recsys/warm.py" in train and "recsys/warm_source.py" not in train
    for deps in (prepare, train, evaluate):
        assert not {d for d in deps if d.startswith(("recsys/registry/", "recsys/commands/", "flows/"))}
        assert "recsys/cli.py" not in deps
    # prepare recovers an interrupted ingest commit before it reads the store, so the ingest package is its
    # dependency (an edit there re-runs prepare, whose identical output then leaves training up to date);
    # training and evaluation never read the store.
    assert "recsys/ingest/recovery.py" in prepare
    assert not {d for d in train | evaluate if d.startswith("recsys/ingest/")}


def test_code_deps_of_a_synthetic_package(tmp_path):
    pkg = tmp_path / "recsys"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import leaf\n")
    (pkg / "sub" / "leaf.py").write_text("import os\n")
    (pkg / "stage.py").write_text("def main():\n    from recsys.sub import thing\n")
    (pkg / "unused.py").write_text("")
    assert code_deps("recsys.stage", tmp_path) == ["recsys/__init__.py", "recsys/stage.py",
                                                  "recsys/sub/__init__.py", "recsys/sub/leaf.py"]


# Spelled in modules owned elsewhere for now (see the entry branch's report): the registry reads the evaluate
# stage's outputs itself.
NOT_YET_ON_THE_LAYOUT = {"recsys/registry/core.py", "recsys/commands/registry.py"}
STAGE_PREFIXES = ("artifacts/", "metrics/", "plots/", ".resume", "data.dvc")
STAGE_SEGMENTS = {"artifacts", "metrics", "plots", "prepared", ".resume", "data", "params.yaml", "data.dvc"}


def _path_literals(source: str) -> list[str]:
    """Strings that spell a stage path: 'artifacts/…'-like literals, or a stage segment joined with `/`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(STAGE_PREFIXES):
            found.append(node.value)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            found += [side.value for side in (node.left, node.right)
                      if isinstance(side, ast.Constant) and side.value in STAGE_SEGMENTS]
    return found


def test_no_module_but_the_layout_spells_a_stage_path():
    offenders = {}
    for path in sorted([*REPO.glob("recsys/**/*.py"), *REPO.glob("flows/*.py")]):
        rel = str(path.relative_to(REPO))
        if rel in NOT_YET_ON_THE_LAYOUT or rel == "recsys/layout.py":
            continue
        found = _path_literals(path.read_text(encoding="utf-8"))
        if found:
            offenders[rel] = found
    assert offenders == {}


def test_no_import_cycles_in_recsys():
    """Every import in recsys/ and flows/ (module level, inside functions and under `TYPE_CHECKING` alike),
    a submodule importing its own package's `__init__` included: the graph has no cycle."""
    import ast

    modules = {}
    for path in [*(REPO / "recsys").rglob("*.py"), *(REPO / "flows").rglob("*.py")]:
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
                deps.add(node.module)
                deps |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in modules}
        graph[name] = deps - {name}

    def cycle_from(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, trail = stack.pop()
            for dep in graph[node]:
                if dep == start:
                    return trail + [start]
                if dep not in seen:
                    seen.add(dep)
                    stack.append((dep, trail + [dep]))
        return None

    cycles = [c for c in (cycle_from(m) for m in sorted(graph)) if c]
    assert not cycles, " ; ".join(" -> ".join(c) for c in cycles[:5])
