"""Where the Ray backend's actors go: resource requests and an optional placement group.

Engines ask for ``runtime.ray_engine_cpus`` / ``ray_engine_gpus`` each, trainer ranks for
``runtime.ray_trainer_cpus`` / ``ray_trainer_gpus`` each. With ``runtime.ray_placement_strategy``
set, all of them are reserved at once as one placement group (bundles: the engines, then the
trainer ranks), so a run either gets everything it needs or fails at start naming what is
missing, instead of starting some actors and waiting for the rest.
"""

from __future__ import annotations


def _bundle(rt, kind: str) -> dict[str, float]:
    cpus, gpus = (rt.ray_engine_cpus, rt.ray_engine_gpus) if kind == "engine" else (rt.ray_trainer_cpus,
                                                                                   rt.ray_trainer_gpus)
    return {"CPU": cpus, **({"GPU": gpus} if gpus else {})}


def reserve(ray, rt, num_engines: int, world_size: int):
    """The placement group (ready), or None when ``ray_placement_strategy`` is unset."""
    if rt.ray_placement_strategy is None:
        return None
    from ray.util.placement_group import placement_group, remove_placement_group

    bundles = [_bundle(rt, "engine")] * num_engines + [_bundle(rt, "trainer")] * world_size
    pg = placement_group(bundles, strategy=rt.ray_placement_strategy)
    if not ray.wait([pg.ready()], timeout=rt.worker_timeout_s)[0]:
        remove_placement_group(pg)
        raise RuntimeError(f"Ray could not reserve {bundles} ({rt.ray_placement_strategy}) within "
                           f"{rt.worker_timeout_s:g}s; the cluster has {ray.available_resources()} free")
    return pg


def actor_options(rt, kind: str, pg, bundle_index: int, max_restarts: int = 0) -> dict:
    """``.options()`` for one worker actor."""
    b = _bundle(rt, kind)
    opts = {"num_cpus": b["CPU"], "num_gpus": b.get("GPU", 0), "max_task_retries": 0,
            "max_restarts": max_restarts}
    if pg is not None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=bundle_index)
    return opts
