"""Full-ranking of a split's targets: the one piece both training (validation) and evaluation (test) use.

Every item is a candidate except padding and the items the user already interacted with before the target;
ties count against the target (`recsys.metrics.target_rank`).
"""

from __future__ import annotations

import numpy as np
import torch

from recsys.device import out_of_memory_as_error
from recsys.metrics import target_rank
from recsys.models.base import SequentialModel
from recsys.sequences import EvalBatch, SequenceData, eval_batch


def model_max_len(model: SequentialModel) -> int:
    return int(getattr(getattr(model, "config", None), "max_len", 1) or 1)


# Scoring batch size 0 (auto, `train.eval_batch_size` / `evaluate.batch_size`): on a CPU, 512 targets a batch;
# on CUDA, as many as keep the model's largest per-batch score table within this many elements (1 GiB of
# float32). Each batch costs the GPU its operators' launches whatever its size — MOJITO scores a batch with
# ~450 kernels, so on ml-1m-half 512-row batches (6 of them) took an H200 0.073 s (benchmarks/RESULTS.md) —
# while a CPU, memory-bound, scores MOJITO's 512-row batches 1.7 × faster than 4,096-row ones.
SCORING_ROWS_CPU = 512
SCORING_ELEMENTS_CUDA = 1 << 28


def scoring_batch_size(setting: int, model: SequentialModel, device: torch.device | str) -> int:
    """Targets per scoring batch: `setting` when positive, else the device's automatic size (above)."""
    if setting > 0:
        return setting
    if torch.device(device).type != "cuda":
        return SCORING_ROWS_CPU
    return max(1, SCORING_ELEMENTS_CUDA // model.scoring_elements_per_row())


def scoring_memory(model: SequentialModel, setting: int, name: str, device: torch.device | str, split: str):
    """A guard for ranking `split`: running out of memory inside it becomes one `DeviceError` line with the
    batch it ranked and the setting `name` (its value `setting`) to lower."""
    rows = scoring_batch_size(setting, model, device)
    now = f"{setting}" + (" = auto" if setting == 0 else "")
    return out_of_memory_as_error(
        device, f"ranking the {split} split ({rows:,} users a batch × {model.n_items + 1:,} items)",
        f"set {name} below {rows} (now {now})")


class RankingInputs:
    """Every target of a split with its model input and seen items, cut into batches once and kept on the
    scoring device, so scoring a split again (validation after every epoch) builds nothing on the host and
    moves nothing to it until the ranks are complete."""

    def __init__(
        self,
        data: SequenceData,
        split: str,
        max_len: int,
        *,
        batch_size: int = 512,
        device: torch.device | str = "cpu",
        item_map: np.ndarray | None = None,
        user_map: np.ndarray | None = None,
        by_length: bool = True,
        mask_seen: bool = True,
    ):
        self.device = torch.device(device)
        self.mask_seen = mask_seen
        self.n_items = data.n_items
        targets = data.eval_targets(split)
        # `by_length`: batches of similar history lengths. A batch is padded to its longest input, and in user
        # order nearly every batch holds one at max_len (ml-1m-half: 1.9 × the real tokens; sorted 1.14 ×).
        # Ranks and users come back in user order (`in_user_order`); a full-ranking rank does not depend on
        # its batch. (The sampled extra does — its draws follow the batch order — so it keeps user order.)
        user_of = np.searchsorted(data.offsets, targets, side="right")
        order = np.argsort(np.minimum(targets - data.offsets[user_of - 1], max_len), kind="stable") \
            if by_length else np.arange(len(targets))
        self._restore = np.argsort(order)  # batch order → user order
        self._restore_on_device = torch.from_numpy(self._restore).to(self.device)
        self.batches: list[EvalBatch] = []
        for start in range(0, len(targets), batch_size):
            eb = eval_batch(data, targets[order[start : start + batch_size]], max_len, item_map, user_map)
            self.batches.append(EvalBatch(
                batch=eb.batch.to(self.device), targets=eb.targets.to(self.device),
                seen_rows=eb.seen_rows.to(self.device), seen_items=eb.seen_items.to(self.device), users=eb.users,
            ))
        self.users = self.in_user_order(np.concatenate([eb.users for eb in self.batches])) if self.batches \
            else np.zeros(0, np.int64)
        # Model id → dataset id columns when the model's vocabulary differs from the dataset's.
        self.item_map = None if item_map is None else torch.from_numpy(item_map).to(self.device)

    def in_user_order(self, values):
        """Per-target values in batch order (a tensor or an array) → in user order, as `eval_targets` lists
        the targets."""
        if not isinstance(values, torch.Tensor):
            return values[self._restore]
        on_device = values.device == self._restore_on_device.device
        return values[self._restore_on_device if on_device else torch.from_numpy(self._restore)]

    def scores(self, model: SequentialModel, eb: EvalBatch) -> torch.Tensor:
        """(B, I + 1) float scores in dataset item ids; items unknown to the model score -inf."""
        scores = model.score(eb.batch).float()  # (B, I_model + 1)
        if self.item_map is not None:
            scores = torch.where(self.item_map > 0, scores[:, self.item_map], float("-inf"))
        return scores

    def candidates(self, scores: torch.Tensor, eb: EvalBatch) -> torch.Tensor:
        """(B, I + 1) bool: every real item the user has not interacted with before the target — every real
        item under `evaluate.mask_seen: false`."""
        candidates = torch.ones_like(scores, dtype=torch.bool)
        candidates[:, 0] = False
        if self.mask_seen:
            candidates[eb.seen_rows, eb.seen_items] = False
        return candidates

    @torch.no_grad()
    def ranks(self, model: SequentialModel) -> torch.Tensor:
        """(n,) full-ranking rank of every target, on the scoring device."""
        was_training = model.training
        model.eval()
        out = []
        for eb in self.batches:
            scores = self.scores(model, eb)
            out.append(ranks_of(scores, eb.targets, self.candidates(scores, eb)))
        model.train(was_training)
        if not out:
            return torch.zeros(0, dtype=torch.long, device=self.device)
        return self.in_user_order(torch.cat(out))


@torch.no_grad()
def rank_targets(
    model: SequentialModel,
    data: SequenceData,
    split: str,
    *,
    batch_size: int = 512,
    device: torch.device | str = "cpu",
    item_map: np.ndarray | None = None,
    user_map: np.ndarray | None = None,
    sampled_negatives: int = 0,
    seed: int = 0,
    mask_seen: bool = True,
) -> tuple[np.ndarray, torch.Tensor, torch.Tensor | None]:
    """(users, full-ranking ranks, sampled ranks or None) for every target of `split`; ranks on the CPU.
    `batch_size` 0: `scoring_batch_size`'s automatic size; `mask_seen`: `evaluate.mask_seen`."""
    batch_size = scoring_batch_size(batch_size, model, device)
    inputs = RankingInputs(data, split, model_max_len(model), batch_size=batch_size, device=device,
                           item_map=item_map, user_map=user_map, by_length=not sampled_negatives,
                           mask_seen=mask_seen)
    if not sampled_negatives:
        return inputs.users, inputs.ranks(model).cpu(), None
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    ranks, sampled = [], []
    for eb in inputs.batches:
        scores = inputs.scores(model, eb)
        candidates = inputs.candidates(scores, eb)
        ranks.append(ranks_of(scores, eb.targets, candidates).cpu())
        # The sampled extra draws on the CPU generator, so it is the same on every device.
        sampled.append(_sampled_rank(scores.cpu(), eb.targets.cpu(), candidates.cpu(), sampled_negatives, generator))
    model.train(was_training)
    if not ranks:
        return inputs.users, torch.zeros(0, dtype=torch.long), None
    return inputs.users, inputs.in_user_order(torch.cat(ranks)), inputs.in_user_order(torch.cat(sampled))


# The rank of a target that cannot be recommended (`ranks_of`): past every cutoff, whatever the catalogue's
# size (its NDCG, HR and MRR are 0, to float precision).
MISS_RANK = 2**31 - 1


def ranks_of(scores: torch.Tensor, targets: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Each target's full-ranking rank among `candidates` (the user's unseen items; every item under
    `evaluate.mask_seen: false`), and a miss (`MISS_RANK`) for a target that is not among them (a repeat,
    where seen items are masked): PROTOCOL.md masks every item in the input,
    the target too. Ranking a repeated target among the unseen ones only (as before, evaluation
    protocol 1) removed its competitors and kept it: on data with repeats (the generated default: a third of
    the targets) every model's figure was inflated — MostPop's test NDCG@10 doubled."""
    rows = torch.arange(len(targets), device=targets.device)
    ranks = target_rank(scores, targets, candidates)
    return torch.where(candidates[rows, targets], ranks, MISS_RANK)


def _sampled_rank(scores, targets, candidates, n, generator) -> torch.Tensor:
    """Rank among `n` uniformly sampled unseen negatives — a labelled extra, never the headline; a repeated
    target is a miss here too (`ranks_of`)."""
    rows = torch.arange(len(targets))
    weights = candidates.double()
    weights[rows, targets] = 0.0
    n = min(n, int(weights.sum(1).min().item()))
    neg = torch.multinomial(weights, n, replacement=False, generator=generator)  # (B, n)
    sub = torch.cat([targets[:, None], neg], dim=1)
    sub_scores = scores.gather(1, sub)
    ranks = target_rank(sub_scores, torch.zeros_like(targets), torch.ones_like(sub_scores, dtype=torch.bool))
    return torch.where(candidates[rows, targets], ranks, MISS_RANK)


def summarise(per_user: dict[str, torch.Tensor]) -> dict[str, float]:
    return {name: float(values.mean()) if len(values) else float("nan") for name, values in per_user.items()}
