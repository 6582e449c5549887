"""Fan-out: each model's `train` + `evaluate` stages reproduced on a worker, shared through the DVC remote.

The coordinator (the retrain flow with `fan_out` set) runs `prepare` and pushes it, then hands each stale
model to a worker as a `WorkOrder`: the git commit to check out and the files a checkout of it lacks
(params.yaml as the coordinator runs it, with any epochs override; dvc.lock, which says which prepared
dataset to pull; the model's warm source record, which says which registry checkpoint — read from the shared
`registry.artifact_root` — it starts from, if any). A worker, starting from a clean clone, checks out the
commit, writes those files, pulls the prepared dataset, puts that warm source in place, reproduces
`train@<model>` and `evaluate@<model>` and pushes their outputs and its run-cache. Same code, same params,
same inputs: the run-cache key DVC computes on the coordinator (`cmd`, every dependency's hash, the params'
values, the output paths) is the worker's, so the coordinator's own `dvc repro --pull` restores every stage
from the bucket instead of training.

Nothing here depends on a worker's disk surviving: an order is complete in its parameters, the worker's
checkout is thrown away, and a lost worker's order is simply handed out again.

Plain Python (no Prefect): `flows/retrain.py` and `flows/train_model.py` call these functions.
"""

from __future__ import annotations

import json
import logging
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

from recsys.atomic import write_text_atomic
from recsys.config import ConfigError, Params, load_params, validate_name
from recsys.layout import PARAMS, WARM_DIR, WARM_SOURCE_FILE, Layout
from recsys.model_configs import TRAINABLE
from recsys.registry.store import artifact_root
from recsys.workspace import DvcError, StageError, run_dvc

log = logging.getLogger(__name__)

DVC_YAML = "dvc.yaml"
DVC_LOCK = "dvc.lock"
# What a worker's checkout of the coordinator's commit lacks: dvc.lock is not committed, and params.yaml may
# differ from the commit (an epochs override, a local registry URL). Beside them only the model's warm
# source record (`warm_source_file`) is shipped.
SHIPPED_FILES = (PARAMS, DVC_LOCK)
MODEL_STAGES = ("train", "evaluate")
# Default `fan_out_idle_minutes` (flows.retrain / flows.pipeline): the coordinator gives up when no worker has
# taken any of its runs, and none has ended, for this long.
IDLE_MINUTES = 30.0
WORKER_FLOW = "train-model"  # the flow fan-out hands each model to (flows/train_model.py)


class FanOutError(StageError):
    """A worker's run of a model failed deterministically (its stage's error, a commit it cannot fetch);
    running it again would fail the same way."""


class WorkerLostError(DvcError):
    """A model's runs kept ending without a result (workers crashed or were lost) more times than allowed."""


def warm_source_file(model: str) -> str:
    """The model's warm source record, relative to the root: the coordinator resolves it (`recsys.warm_source`)
    and ships it, so a worker starts from the same champion — or from nothing, for the same reason."""
    return f"{WARM_DIR.format(model=validate_name(model, 'model name'))}/{WARM_SOURCE_FILE}"


def model_stages(model: str) -> list[str]:
    return [f"{stage}@{model}" for stage in MODEL_STAGES]


@dataclass(frozen=True)
class WorkOrder:
    """Everything a worker needs to reproduce one model's stages, as the coordinator would."""

    model: str
    commit: str
    files: dict[str, str] = field(default_factory=dict)  # path relative to the root -> text

    def __post_init__(self) -> None:
        validate_name(self.model, "model name")
        if not (len(self.commit) == 40 and all(c in "0123456789abcdef" for c in self.commit)):
            raise ConfigError(f"work order for {self.model}: commit must be a full 40-digit git sha, got "
                              f"{self.commit!r}")
        allowed = [*SHIPPED_FILES, warm_source_file(self.model)]
        unknown = sorted(set(self.files) - set(allowed))
        if unknown:
            raise ConfigError(f"work order for {self.model}: only {allowed} are shipped to a worker, not {unknown}")
        missing = [name for name in (PARAMS, warm_source_file(self.model)) if name not in self.files]
        if missing:
            raise ConfigError(f"work order for {self.model}: {missing} missing")

    def parameters(self) -> dict[str, Any]:
        """The worker flow's parameters (`flows/train_model.py`)."""
        return {"model": self.model, "commit": self.commit, "files": dict(self.files)}


def check_deployment_name(deployment: str) -> None:
    """`fan_out` names a deployment as Prefect does, `<flow name>/<deployment name>` (Prefect's own check is a
    traceback, and an empty value would silently mean "no fan-out")."""
    parts = deployment.split("/")
    if len(parts) != 2 or not all(part.strip() for part in parts):
        raise ConfigError(f"fan_out must name a deployment as <flow>/<deployment>, e.g. train-model/worker "
                          f"(the `prefect deployment ls` names), got {deployment!r}")
    if parts[0] != WORKER_FLOW:  # a run of another flow (retrain/manual) got parameters it does not take
        raise ConfigError(f"fan_out must name a deployment of the {WORKER_FLOW} flow (flows/train_model.py), "
                          f"e.g. {WORKER_FLOW}/worker; {deployment!r} is a deployment of {parts[0]!r}")


def force_refused(fan_out: str = "fan_out") -> str:
    """Why `--force` and fan-out do not mix, naming fan-out as the caller spells it (`--fan-out` on a command
    line, the `fan_out` parameter in a UI or API run)."""
    return (f"--force cannot be combined with {fan_out}: a forced run skips DVC's run-cache, which is how "
            f"the workers' results reach this workspace; run without {fan_out} to force, or change what "
            "should retrain (data, params, code)")


def check_fan_out(params: Params, models: Iterable[str], force: bool, root: Path | None = None) -> None:
    """Refuse what fan-out cannot do faithfully, before anything runs, with the setting that fixes it."""
    if force:
        raise ConfigError(force_refused())
    warm = [m for m in models if TRAINABLE.get(m, False) and params.train_config(m).init != "cold"]
    setting = params.registry.artifact_root
    inside = (not Path(setting).is_absolute() if root is None
              else artifact_root(setting, root).resolve().is_relative_to(Path(root).resolve()))
    if warm and inside:
        raise ConfigError(f"fan_out with train.init warm or auto ({warm}) needs registry.artifact_root to be "
                          "storage every worker mounts at the same absolute path, outside the workspace (the "
                          f"workers copy the champion's weights from it); {params.registry.artifact_root!r} is "
                          "in this workspace, which a worker's clone lacks: set it, or train.init: cold, or run "
                          "without fan_out")
    if warm and not Path(setting).is_absolute():
        raise ConfigError(f"fan_out with train.init warm or auto ({warm}) needs registry.artifact_root to be an "
                          f"absolute path every worker mounts; {setting!r} is relative, so each worker would "
                          "resolve it inside its own clone: set an absolute path, or train.init: cold, or run "
                          "without fan_out")


def head_commit(root: Path) -> str:
    done = _git(root, "rev-parse", "HEAD")
    if done.returncode != 0:
        raise ConfigError(f"fan_out needs a git checkout whose commit the workers can clone; {root} has none "
                          f"({done.stderr.strip()})")
    return done.stdout.strip()


def code_paths(dvc_yaml: dict[str, Any]) -> set[str]:
    """The files `train@*` and `evaluate@*` depend on that git carries: dvc.yaml and the stages' Python
    modules (recsys.dvc_graph lists every module a stage imports; the other deps are pipeline data)."""
    stages = (dvc_yaml or {}).get("stages") or {}
    paths = {DVC_YAML}
    for name in MODEL_STAGES:
        body = stages.get(name) or {}
        paths.update(dep for dep in (body.get("do") or body).get("deps") or [] if dep.endswith(".py"))
    return paths


def uncommitted_code(root: Path) -> list[str]:
    """Stage code (and dvc.yaml) that differs from HEAD here, including files git does not track yet: the
    workers would run the committed version, so their run-cache entries would not match this workspace."""
    deps = code_paths(yaml.safe_load((Path(root) / DVC_YAML).read_text(encoding="utf-8")))
    done = _git(root, "status", "--porcelain", "--untracked-files=all", "--", *sorted(deps))
    return sorted(line[3:] for line in done.stdout.splitlines() if line[3:] in deps)


def unpushed(root: Path, commit: str) -> bool:
    """Whether `commit` is on no branch of `origin` this checkout knows: the workers fetch it from their
    clone's `origin` (`check_out`), so one that only this checkout holds fails on every worker. (A checkout
    without an `origin` says nothing: its deployment's clone step names the repository.)"""
    if "origin" not in _git(root, "remote").stdout.split():
        return False
    done = _git(root, "branch", "--remotes", "--contains", commit, "--list", "origin/*")
    if done.returncode != 0:
        raise ConfigError(f"fan_out cannot tell whether HEAD {commit[:12]} is pushed: git branch failed "
                          f"({done.stderr.strip()})")
    return not done.stdout.strip()


def clone_urls(pull_steps: list[dict[str, Any]] | None) -> list[str]:
    """The repositories a Prefect deployment's pull steps clone (its `git_clone` steps)."""
    urls = []
    for step in pull_steps or []:
        for name, body in (step or {}).items():
            if str(name).endswith("git_clone") and isinstance(body, dict) and body.get("repository"):
                urls.append(str(body["repository"]))
    return urls


def without_credentials(url: str) -> str:
    """A git remote's address fit to show and compare: without the `user:token@` a clone URL may carry (Prefect's
    `git_clone` with an access token clones from one, so a worker's `origin` holds the token). An scp-like
    `git@host:path` has no secret and is kept."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url.strip())
    if not parts.scheme or "@" not in parts.netloc:
        return url.strip()
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _repository_key(url: str, root: Path) -> str:
    """A repository address compared loosely: without credentials, a trailing `/` or `.git`, a local path (or
    file:// URL) resolved (a relative one, as git reads origin's, from the checkout)."""
    url = without_credentials(url).rstrip("/")
    url = url.removeprefix("file://")
    url = url.removesuffix(".git")
    return str((Path(root) / url).resolve()) if url.startswith(("/", ".")) else url


def clone_mismatch(root: Path, commit: str, pull_steps: list[dict[str, Any]] | None) -> str | None:
    """Why `committed_head`'s push check may not hold for the workers: they clone another repository than
    this checkout's `origin` (the deployment's pull step names it, e.g. RECSYS_GIT_URL at deploy time).
    None when they clone `origin`, or when either is unknown."""
    origin = _git(root, "remote", "get-url", "origin")
    urls = clone_urls(pull_steps)
    if origin.returncode != 0 or not urls:
        return None
    here = origin.stdout.strip()
    if any(_repository_key(url, root) == _repository_key(here, root) for url in urls):
        return None
    there, here = without_credentials(urls[0]), without_credentials(here)
    return (f"the workers clone {there} (the deployment's pull step) but this checkout's origin is {here}: "
            f"HEAD {commit[:12]} was checked against origin only; push it to {there} too (or redeploy with "
            "RECSYS_GIT_URL set to origin's URL)")


def committed_head(root: Path) -> str:
    """HEAD, once it is what the workers will run: no stage code differs from it, and `origin` holds it."""
    commit = head_commit(root)
    dirty = uncommitted_code(root)
    if dirty:
        raise ConfigError(f"fan_out runs the committed code on the workers, but {', '.join(dirty)} differ(s) from "
                          f"HEAD {commit[:12]}: commit and push first (or run without fan_out)")
    if unpushed(root, commit):
        raise ConfigError(f"fan_out's workers clone the repository and check out HEAD {commit[:12]}, which no "
                          "branch of origin holds: `git push` it first (or `git fetch`, if it was pushed from "
                          "another checkout)")
    return commit


def work_order(root: Path, model: str, commit: str) -> WorkOrder:
    root = Path(root)
    names = (*SHIPPED_FILES, warm_source_file(model))
    files = {name: (root / name).read_text(encoding="utf-8") for name in names if (root / name).is_file()}
    if DVC_LOCK not in files or "prepare" not in (yaml.safe_load(files[DVC_LOCK]) or {}).get("stages", {}):
        raise ConfigError(f"{root / DVC_LOCK} has no `prepare` entry: run `dvc repro prepare` before fanning out")
    if warm_source_file(model) not in files:
        raise ConfigError(f"{root / warm_source_file(model)} is missing: run `recsys warm` (the retrain flow "
                          "does) before fanning out")
    if PARAMS in files:
        files[PARAMS] = without_registry_password(files[PARAMS])
    return WorkOrder(model=model, commit=commit, files=files)


def without_registry_password(params_text: str) -> str:
    """params.yaml as shipped in a work order — stored by the Prefect server with the run's parameters and
    shown in its UI — with `registry.url`'s password replaced by `***`: workers never open the registry,
    and no stage reads the `registry` section (the rest of the text, comments too, is kept byte for byte)."""
    from recsys.registry.db import masked_url

    node = _registry_url_node(params_text)
    if node is None:
        return params_text
    hidden = masked_url(node.value)  # the user-part's password and ?password=…, also in a malformed URL
    if hidden == node.value:
        return params_text
    # The URL scalar's own span in the text, so that nothing else changes (a dump would drop comments and
    # re-type YAML 1.1 values); written plain as it was, or double-quoted.
    start, end = node.start_mark.index, node.end_mark.index
    return params_text[:start] + (hidden if node.style is None else json.dumps(hidden)) + params_text[end:]


def _registry_url_node(params_text: str) -> yaml.ScalarNode | None:
    """The string scalar `registry.url` is read from (the last one, as loading keeps the last of a repeated
    key), with its place in the text; None when there is none."""
    root = yaml.compose(params_text, Loader=yaml.SafeLoader)
    found = None
    for key, value in root.value if isinstance(root, yaml.MappingNode) else ():
        if key.value == "registry" and isinstance(value, yaml.MappingNode):
            for inner_key, node in value.value:
                if (inner_key.value == "url" and isinstance(node, yaml.ScalarNode)
                        and node.tag == "tag:yaml.org,2002:str"):
                    found = node
    return found


def stale_models(root: Path, models: list[str]) -> list[str]:
    """Models whose train or evaluate stage `dvc repro` would run (prepare is assumed up to date)."""
    targets = [s for m in models for s in model_stages(m)]
    done = run_dvc(Path(root), "status", "--json", *targets)
    stale = {name.partition("@")[2] for name in json.loads(done.stdout or "{}") if "@" in name}
    return [m for m in models if m in stale]


# --- the worker's side -------------------------------------------------------------------------------------


def check_out(root: Path, order: WorkOrder) -> None:
    """Put the worker's clean clone at the order's commit and write the shipped files."""
    root = Path(root)
    if head_commit(root) != order.commit:
        fetched = _git(root, "fetch", "--quiet", "--depth", "1", "origin", order.commit)
        if fetched.returncode != 0:
            origin = without_credentials(_git(root, "remote", "get-url", "origin").stdout) or "origin"
            raise FanOutError(f"commit {order.commit[:12]} is not in the repository this worker clones "
                              f"({origin}): push it before fanning out "
                              f"({fetched.stderr.strip().splitlines()[-1:]})")
        checked = _git(root, "checkout", "--quiet", "--detach", order.commit)
        if checked.returncode != 0:
            raise FanOutError(f"cannot check out {order.commit[:12]}: {checked.stderr.strip()}")
    for name, text in order.files.items():
        if name != warm_source_file(order.model):  # `reproduce` puts the warm source in place
            write_text_atomic(root / name, text, (root / name).parent)


def reproduce(root: Path, model: str, warm_source: str) -> list[str]:
    """Pull the prepared dataset, put the coordinator's warm source in place (`warm_source`: its record, from
    the work order), reproduce the model's two stages. Returns the stages that ran. (`--single-item`: the
    worker has no raw store; `prepare` is the coordinator's.)"""
    from recsys.warm_source import WarmSourceUnavailable, materialise_warm_source

    root = Path(root)
    run_dvc(root, "pull", "prepare")
    try:
        materialise_warm_source(root, load_params(Layout(root).params), model, warm_source)
    except WarmSourceUnavailable as err:
        raise FanOutError(str(err)) from err
    # One `dvc` process for both (with --single-item the targets run in the order given).
    return running_stages(run_dvc(root, "repro", "--single-item", *model_stages(model)).stdout)


def running_stages(dvc_output: str) -> list[str]:
    """The stages a `dvc repro` ran, in order (its "Running stage '<name>':" lines)."""
    return [line.split("'")[1] for line in dvc_output.splitlines() if line.startswith("Running stage '")]


def push(root: Path, model: str) -> None:
    """The model's outputs and this clone's run-cache (only this run's entries: the clone started empty)."""
    run_dvc(Path(root), "push", "--run-cache", *model_stages(model))


def summary(root: Path, model: str) -> dict[str, Any]:
    metrics = json.loads(Layout(Path(root)).metrics(model).read_text(encoding="utf-8"))
    return {"model": model, "test_ndcg@10": metrics.get("ndcg@10"),
            "valid_ndcg@10": (metrics.get("valid") or {}).get("ndcg@10")}


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
