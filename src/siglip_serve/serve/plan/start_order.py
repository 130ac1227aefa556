"""Which replicas a start runs first, where they would race each other's imports on too few cores.

Serve starts every replica of an application at once. Each replica's process spends its first seconds on
CPU-bound work (Ray's worker, torch, open_clip, the model's build), so where more replicas start than the
host has cores, they share the cores and the first answer waits for all of them. What the first answer
needs is each model's `min_ready` image replicas (what /readyz counts), its text replicas and the ingress;
no more replicas than cores start first, never fewer than those, and the rest once they are warm
(launcher/runner.py runs the application twice, the second time with the plan's full counts: Serve adds the
replicas, and the ones running keep running: a deployment's version does not hold its count (serve/app.py
`pinned`), and Serve changes `num_replicas` in place, a LightWeight option in ray/serve/_private/config.py).

Only where the count is fixed: an autoscaled deployment starts at its own floor, and a replica kept for the
interactive lane is one the first answer may need.
"""

from __future__ import annotations

from siglip_serve.serve.plan.service_plan import ServicePlan, TowerPlan


def starting_replicas(plan: ServicePlan) -> int:
    """The replicas `plan` starts at once: every model's towers' floors and the ingress's."""
    towers = sum(tower.min_replicas for model in plan.models for tower in model.towers.values())
    return plan.ingress.replicas + towers


def deferrable(image: TowerPlan) -> int:
    """How many of `image`'s replicas the first answer does not need: those past its `min_ready`, where the
    count is fixed and none is kept for the interactive lane."""
    fixed = image.deployment.num_replicas is not None and image.interactive is None
    return max(0, image.replicas - image.min_ready) if fixed else 0


def first_wave(plan: ServicePlan, cores: int) -> dict[str, int] | None:
    """By served model, the image replicas to start first where `plan` would start more replicas than `cores`:
    as many deferred as bring the start down to `cores` (models in order, none below its `min_ready`), the rest
    following once those are warm; None to start every replica at once."""
    excess = starting_replicas(plan) - cores
    first: dict[str, int] = {}
    for model in plan.models:
        cut = min(deferrable(model.image), excess)
        if cut > 0:
            first[model.name] = model.image.replicas - cut
            excess -= cut
    return first or None
