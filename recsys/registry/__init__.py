"""SQL model registry: versions, the `champion` alias, content-addressed artifacts, the promotion gate.

    registry = open_registry(params.registry, repo_root, params.gate)
    decision = promote(candidate_dir, eval_result, params=params, mostpop_result=mostpop)
"""

from recsys.registry.core import (
    EventInfo,
    NotFoundError,
    PromotionDecision,
    Registry,
    RegistryError,
    RollbackError,
    StoredEval,
    VersionInfo,
    open_registry,
    promote,
    read_eval_outputs,
)
from recsys.registry.store import ArtifactError, ArtifactIntegrityError, ArtifactStore

__all__ = [
    "ArtifactError",
    "ArtifactIntegrityError",
    "ArtifactStore",
    "EventInfo",
    "NotFoundError",
    "PromotionDecision",
    "Registry",
    "RegistryError",
    "RollbackError",
    "StoredEval",
    "VersionInfo",
    "open_registry",
    "promote",
    "read_eval_outputs",
]
