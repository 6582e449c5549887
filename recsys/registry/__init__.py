"""SQL model registry: versions, the `champion` alias, content-addressed artifacts, compare-and-promote.

    registry = open_registry(params.registry, repo_root, params.gate)
    decision = registry.promote(candidate_dir, eval_result, params=..., rescore=...)

Lineage capture and the pipeline's promotion step live beside it (`recsys.lineage`, `recsys.promotion`).
"""

from recsys.registry.core import REGISTRY_URL_ENV, Registry, open_registry, registry_url
from recsys.registry.records import (
    BASELINE_ROLE,
    EventInfo,
    NotFoundError,
    PromotionDecision,
    RegistryDatabaseError,
    RegistryError,
    RollbackError,
    VersionInfo,
    database_errors,
)
from recsys.registry.store import ArtifactError, ArtifactIntegrityError, ArtifactStore

__all__ = [
    "BASELINE_ROLE",
    "REGISTRY_URL_ENV",
    "ArtifactError",
    "ArtifactIntegrityError",
    "ArtifactStore",
    "EventInfo",
    "NotFoundError",
    "PromotionDecision",
    "Registry",
    "RegistryDatabaseError",
    "RegistryError",
    "RollbackError",
    "VersionInfo",
    "database_errors",
    "open_registry",
    "registry_url",
]
