"""The model registry's writes: registration, the baseline champion, compare-and-promote, rollback.

`promote` in three steps, each safe to repeat after a crash (the compare-and-swap paths of registration and the
gate side by side in this one file, under one locking rule):
1. validate everything, then store the checkpoint content-addressed (`ArtifactStore.put`, idempotent) —
   a refused registration never leaves a copy behind;
2. register the version under the model's write lock — its number is allocated inside that locked
   transaction (max + 1, backed by a unique constraint), and the same artifact always maps to the same
   version, so a re-run never mints a second one;
3. gate + alias move + event in one locked transaction. The champion is re-scored on the candidate's
   evaluation set *before* taking the lock (evaluation is slow; holding a write lock through it would
   stall every other writer); inside the lock the champion is re-read and, if it changed meanwhile, the
   transaction is abandoned and step 3 retried against the new champion. A decision already recorded for
   (this artifact, this evaluation fingerprint) is returned, never decided twice; a `promoted` one whose
   version is no longer champion comes back with `promoted` False and the `rollback --to` that serves it.

The registry knows rows, aliases, the audit trail and artifacts — not pipeline paths, git, or which model
is the baseline: the caller says how to re-score a champion (`rescore`) and which version is a baseline
(`install_baseline`); `recsys.promotion` is that caller for the CLI and the flow alike. Registration and the
gate's locked writes stay together here; beside them: reads in reads.py, a version's scores on an evaluation
set (and re-scoring the champion, done before the lock) in evaluations.py, the other locked writes — rollback
in rollback.py, making the baseline champion in baseline.py — and the alias move in db.py.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Mapping

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from recsys.config import REGISTRY_URL_ENV, ConfigError, GateConfig, RegistryConfig, validate_name
from recsys.gate import GateDecision, Scores, decide, load_statistics
from recsys.registry.baseline import make_baseline_champion
from recsys.registry.db import (
    ModelVersion,
    PromotionEvent,
    RegisteredModel,
    locked_session,
    make_engine,
    masked_url,
    move_champion,
    read_session,
    resolve_url,
    session_scope,
)
from recsys.registry.evaluations import RescoreFn, add_evaluation, champion_scores, has_evaluation, scores_of
from recsys.registry.migrate import upgrade as upgrade_schema
from recsys.registry.reads import RegistryReads
from recsys.registry.records import (
    BASELINE_ROLE,
    Champion,
    EventInfo,
    PromotionDecision,
    RegistryError,
    VersionInfo,
    clean_metrics,
    decision_from_event,
    finite_or_none,
    per_user_columns,
    read_meta,
)
from recsys.registry.store import ArtifactStore, StoredArtifact, artifact_root

log = logging.getLogger(__name__)

_MAX_ATTEMPTS = 20
# Column widths of model_versions (see db.py): checked before anything is copied or written.
_LIMITS = {"dataset_version": 128, "code_version": 64, "eval_fingerprint": 64}


def _outdated(recorded: PromotionDecision, champion: int | None) -> bool:
    """A recorded rejection is decided again once the champion it was measured against is no longer the
    champion (a baseline installed since, a rollback): replaying it would keep a candidate out on a comparison
    with a model that does not serve. A promotion is replayed as it was (`promote` says when it no longer
    serves)."""
    return recorded.decision == "rejected" and recorded.baseline_version != champion


class _ChampionChanged(Exception):
    """Internal: the champion moved between scoring it and taking the lock; decide again."""


class Registry(RegistryReads):
    # -- model row --

    def _ensure_model(self) -> None:
        with read_session(self.engine) as session:
            if self._model_id(session) is not None:
                return
        try:
            with session_scope(self.engine) as session:
                session.add(RegisteredModel(name=self.model_name))
        except IntegrityError:
            pass  # another process created it first; that is all we wanted

    # -- registration --

    def check_registration(
        self,
        candidate_dir: Path,
        eval_result: Any,
        *,
        params: Mapping[str, Any] | None = None,
        dataset_version: str | None = None,
        code_version: str | None = None,
        role: str | None = None,
    ) -> dict[str, Any]:
        """Raise if `register` would refuse these arguments; touches neither the store nor the database."""
        meta = read_meta(Path(candidate_dir))
        architecture = validate_name(str(meta.get("model")), "architecture")
        fingerprint = getattr(eval_result, "eval_fingerprint", None) or None
        for name, value in (("dataset_version", dataset_version), ("code_version", code_version),
                            ("eval_fingerprint", fingerprint)):
            if value is not None and not str(value).strip():
                raise RegistryError(f"{name} is empty: leave it unset for the recorded default, "
                                    "or give a label")
            if value is not None and len(str(value)) > _LIMITS[name]:
                raise RegistryError(
                    f"{name} is longer than {_LIMITS[name]} characters "
                    f"({len(str(value))}: {str(value)[:40]!r}...)"
                )
        if role is not None:
            validate_name(role, "role")
        try:
            version_params = json.loads(json.dumps(dict(params) if params else {"config": meta.get("config")},
                                                   allow_nan=False))
        except (TypeError, ValueError) as err:
            raise RegistryError(f"version params are not JSON-serialisable: {err}") from err
        return {"architecture": architecture, "params": version_params, "meta": meta}

    def register(
        self,
        candidate_dir: Path,
        eval_result: Any,
        *,
        params: Mapping[str, Any] | None = None,
        dataset_version: str | None = None,
        code_version: str | None = None,
        role: str | None = None,
    ) -> tuple[int, StoredArtifact]:
        """Validate, store the checkpoint and register it as a version (or find the existing one).

        Returns (version number, stored artifact). Everything that can be refused is refused before the
        checkpoint is copied into the store.
        """
        checked = self.check_registration(candidate_dir, eval_result, params=params, role=role,
                                          dataset_version=dataset_version, code_version=code_version)
        architecture, version_params, meta = checked["architecture"], checked["params"], checked["meta"]
        fingerprint = getattr(eval_result, "eval_fingerprint", None) or None
        metrics = clean_metrics(getattr(eval_result, "metrics", None))
        dataset_fp = meta.get("dataset_fingerprint")
        self._ensure_model()

        stored = self.store.put(Path(candidate_dir))
        scored = getattr(eval_result, "checkpoint_sha256", None)
        if scored is not None and scored != stored.sha256:
            # Changed between the promotion's check (`promotion.check_scored`) and this copy: a `recsys train`
            # by hand meanwhile, which takes no workspace lock. The copy stays unreferenced in the store.
            raise RegistryError(f"{candidate_dir} changed while it was being registered (its evaluation scored "
                                f"{scored[:12]}, the copy is {stored.sha256[:12]}): nothing was registered; "
                                "evaluate it again, then promote")
        # The per-user table is converted (before the lock) only for an evaluation the registry lacks: a
        # re-registration — every run with nothing new — leaves it unread, and reading it loads pandas.
        if fingerprint is None:
            known = False
        else:
            with read_session(self.engine) as session:
                known = has_evaluation(session, self._model_id(session), stored.sha256, fingerprint)
        per_user = None if known else per_user_columns(getattr(eval_result, "per_user", None))

        def per_user_now() -> dict[str, Any] | None:
            # Asked only when the evaluation is missing under the lock; a `known` one cannot be (evaluations
            # are never deleted), so converting here is only a safety net.
            return per_user_columns(getattr(eval_result, "per_user", None)) if known else per_user

        with locked_session(self.engine, self.model_name) as (session, model):
            version = session.scalars(
                select(ModelVersion).where(
                    ModelVersion.model_id == model.id, ModelVersion.artifact_sha256 == stored.sha256
                )
            ).one_or_none()
            if version is None:
                last = session.scalar(
                    select(func.max(ModelVersion.version)).where(ModelVersion.model_id == model.id)
                )
                version = ModelVersion(
                    model_id=model.id,
                    version=(last or 0) + 1,
                    architecture=architecture,
                    params=version_params,
                    artifact_uri=stored.uri,
                    artifact_sha256=stored.sha256,
                    dataset_version=dataset_version,
                    dataset_fingerprint=str(dataset_fp) if dataset_fp is not None else None,
                    code_version=code_version,
                    metrics=metrics,
                    eval_fingerprint=fingerprint,
                    status="registered",
                    role=role,
                )
                session.add(version)
                session.flush()
                log.info("registered model=%s version=%d sha256=%s", self.model_name, version.version,
                         stored.sha256[:12])
            elif role is not None and version.role is None:
                version.role = role
            if fingerprint is not None:
                add_evaluation(session, version.id, fingerprint, metrics, "registration", per_user_now)
            return version.version, stored

    # -- the baseline champion --

    def install_baseline(
        self, checkpoint_dir: Path, eval_result: Any, **lineage: Any
    ) -> int | None:
        """Register `checkpoint_dir` marked as the baseline and make it champion while no model has passed
        the gate (no champion, or the champion is an older baseline). Returns the baseline champion's
        version, or None when a gated model is champion (then nothing but the registration happens).
        Recorded as a `promoted` event without a gate comparison; repeating it changes nothing."""
        number, stored = self.register(checkpoint_dir, eval_result, role=BASELINE_ROLE, **lineage)
        return make_baseline_champion(self, number, stored.sha256, self.gate.metric)

    # -- promotion --

    def promote(
        self,
        candidate_dir: Path,
        eval_result: Any,
        *,
        params: Mapping[str, Any] | None = None,
        dataset_version: str | None = None,
        code_version: str | None = None,
        baseline_result: Any = None,
        baseline_kind: str = "reference",
        rescore: RescoreFn | None = None,
        incomparable: Callable[[VersionInfo], str | None] | None = None,
    ) -> PromotionDecision:
        """Register the candidate and gate it against the champion — re-scored on the candidate's
        evaluation set by `rescore(champion_dir)` when it was never scored there — or, with no champion,
        against `baseline_result` (an unregistered reference, labelled `baseline_kind`).
        `incomparable(champion)` says why a champion's score on the candidate's evaluation set cannot be
        trusted (None: it can); such a champion is not re-scored, and the candidate is gated against
        `baseline_result` instead."""
        validate_name(baseline_kind, "baseline kind")
        number, stored = self.register(
            candidate_dir, eval_result, params=params, dataset_version=dataset_version,
            code_version=code_version,
        )
        metric = self.gate.metric
        fingerprint = getattr(eval_result, "eval_fingerprint", None) or None
        replay = self._recorded_decision(stored.sha256, fingerprint)
        champion_now = self.champion_version() if replay is not None else None
        # What a rejection was measured against while this champion serves: none when it cannot be compared.
        yardstick = champion_now
        if champion_now is not None and incomparable is not None:
            yardstick = None if incomparable(self.get_version(champion_now)) else champion_now
        if replay is not None and not _outdated(replay, yardstick):
            if replay.promoted and champion_now != replay.version:
                # Promoted once, champion no longer (a rollback, or a later promotion): the replay moves
                # nothing, so it must not say the candidate serves.
                return dataclasses.replace(replay, promoted=False, reason=(
                    f"{replay.reason}; since then v{champion_now} became the champion (a rollback or a later "
                    f"promotion), and a replay changes nothing: `recsys registry rollback --to "
                    f"{replay.version}` serves it again"))
            return replay
        candidate = scores_of(eval_result, metric)
        load_statistics()  # before the locked section below, not inside it
        reference = scores_of(baseline_result, metric) if baseline_result is not None else None

        for _attempt in range(_MAX_ATTEMPTS):
            champion = self._champion()
            baseline: Scores | None = None
            other = champion is not None and champion.artifact_sha256 != stored.sha256
            why_not = incomparable(self.get_version(champion.version)) if other and incomparable else None
            if other and why_not is None:
                baseline = (
                    champion_scores(self.engine, self.store, champion, fingerprint, rescore, metric)
                    if fingerprint
                    else Scores(None, None)
                )
            try:
                return self._decide_locked(stored.sha256, fingerprint, candidate, champion, baseline,
                                           reference, baseline_kind, why_not)
            except _ChampionChanged:
                log.info("champion changed while scoring it; deciding again")
        raise RegistryError(f"the champion kept changing; gave up after {_MAX_ATTEMPTS} attempts")

    def _decide_locked(
        self,
        sha256: str,
        fingerprint: str | None,
        candidate: Scores,
        champion: Champion | None,
        baseline: Scores | None,
        reference: Scores | None,
        reference_kind: str,
        incomparable: str | None = None,
    ) -> PromotionDecision:
        gate = self.gate
        with locked_session(self.engine, self.model_name) as (session, model):
            version = session.scalars(
                select(ModelVersion).where(
                    ModelVersion.model_id == model.id, ModelVersion.artifact_sha256 == sha256
                )
            ).one()
            recorded = self._find_decision(session, version, fingerprint)
            current = self._champion_in(session)
            if (current.version_id if current else None) != (champion.version_id if champion else None):
                raise _ChampionChanged  # rolls the transaction back; nothing was written
            # (`incomparable` was worked out for `champion`, which is `current`)
            yardstick = current.version if current is not None and incomparable is None else None
            if recorded is not None and not _outdated(recorded, yardstick):
                return recorded

            baseline_kind: str | None
            baseline_version_id: int | None
            if current is not None and current.version_id == version.id:
                outcome = GateDecision(
                    False, f"v{version.version} is already the champion", candidate.metric_value
                )
                baseline_kind, baseline_version_id = "champion", current.version_id
            elif current is not None and incomparable is None:
                label = f"{'baseline ' if current.role == BASELINE_ROLE else ''}champion v{current.version}"
                outcome = decide(candidate, baseline, gate, baseline_label=label)
                baseline_kind, baseline_version_id = "champion", current.version_id
            elif reference is None:
                why = (
                    "no champion yet and no baseline result to compare against: the first champion must beat "
                    "the baseline on the same evaluation set" if current is None else
                    f"not gated against the champion v{current.version}, which {incomparable}; and there is "
                    f"no {reference_kind} result on this evaluation set to gate against instead"
                )
                first = f"evaluate it first: `dvc repro evaluate@{reference_kind}`"
                outcome = GateDecision(False, f"{why} ({first})", candidate.metric_value)
                baseline_kind, baseline_version_id = None, None
            else:
                outcome = decide(candidate, reference, gate, baseline_label=reference_kind)
                if current is not None:  # the champion is there but cannot be compared: say why, once
                    outcome = dataclasses.replace(outcome, reason=(
                        f"{outcome.reason} (gated against {reference_kind}, not the champion "
                        f"v{current.version}, which {incomparable})"))
                baseline_kind, baseline_version_id = reference_kind, None

            decision = "promoted" if outcome.promote else "rejected"
            if outcome.promote:
                move_champion(session, model.id, version.id)
                version.status = "promoted"
            elif version.status == "registered":
                version.status = "rejected"
            event = PromotionEvent(
                model_id=model.id,
                candidate_version_id=version.id,
                baseline_version_id=baseline_version_id,
                baseline_kind=baseline_kind,
                metric=gate.metric,
                candidate_metric=finite_or_none(outcome.candidate_metric),
                baseline_metric=finite_or_none(outcome.baseline_metric),
                eval_fingerprint=fingerprint,
                delta=finite_or_none(outcome.delta),
                p_value=finite_or_none(outcome.p_value),
                min_delta=gate.min_delta,
                significance=gate.significance,
                alpha=gate.alpha,
                decision=decision,
                reason=outcome.reason,
            )
            session.add(event)
            log.info("gate model=%s version=%d decision=%s reason=%s", self.model_name, version.version,
                     decision, outcome.reason)
            # The version compared against (as a replay reads it back): None when it was the reference.
            compared = current.version if current is not None and baseline_version_id is not None else None
            return decision_from_event(event, version, compared)

    # -- rollback --

    def rollback(self, to_version: int | None = None) -> EventInfo:
        """Move the champion back to the previous champion, or to `to_version` (a once-promoted version)."""
        from recsys.registry.rollback import rollback

        self._ensure_model()
        return rollback(self, to_version)


def registry_url(config: RegistryConfig) -> str:
    """The URL the registry is opened at: RECSYS_REGISTRY_URL when it is set, else `config.url`. Set but
    empty is refused rather than read as "not set": a deployment that meant to give a URL would otherwise
    write to the laptop default in params.yaml."""
    url = os.environ.get(REGISTRY_URL_ENV)
    if url is None:
        return config.url
    if not url.strip():
        raise ConfigError(f"{REGISTRY_URL_ENV} is set but empty: unset it to use params.yaml's registry.url, "
                          "or set it to the registry's SQLAlchemy URL (postgresql+psycopg://user:pw@host/db)")
    return url


def open_registry(
    config: RegistryConfig, repo_root: Path, gate: GateConfig | None = None, read_only: bool = False
) -> Registry:
    """Connect to the registry named by `config` or RECSYS_REGISTRY_URL (`registry_url`; relative paths are
    under `repo_root`), migrating it to the latest schema first. `read_only`: a caller that only reads
    (listing, serving) and must not create a SQLite registry file that does not exist yet: it reads an empty
    registry instead."""
    repo_root = Path(repo_root)
    validate_name(config.model_name, "registry.model_name")
    store = ArtifactStore(artifact_root(config.artifact_root, repo_root))  # refused before a database is made
    url = registry_url(config)
    try:
        engine = make_engine(resolve_url(url, repo_root, read_only))
    except Exception as err:  # a malformed URL, a missing driver
        setting = REGISTRY_URL_ENV if REGISTRY_URL_ENV in os.environ else "registry.url"
        detail = str(err).replace(url, masked_url(url))  # the password never reaches a message
        raise ConfigError(f"{setting}: cannot use {masked_url(url)!r}: {detail}") from err
    try:
        upgrade_schema(engine)
    except BaseException:
        engine.dispose()
        raise
    return Registry(engine, store, config.model_name, gate)
