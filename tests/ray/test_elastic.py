"""Elastic engines on a multi-node local Ray cluster: an engine removed and one added mid-run by
`tokenflow engines`, nothing lost or repeated, the added engine's tokens tagged with the
versions it really loaded."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.runtime.helpers import ledger, small_config, step_rows
from tokenflow.cli.main import build_parser
from tokenflow.metrics.sinks import read_jsonl
from tokenflow.runtime.launch import train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # a real run on three Ray nodes; a lost group would hang it

STEPS = 40


@pytest.fixture(scope="module")
def three_nodes():
    """Three Ray nodes (raylets) on this machine, 1 + 1 + 2 logical CPUs: the trainer and the two
    first engines take three, the added engine the fourth."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    for cpus in (1, 2):
        cluster.add_node(num_cpus=cpus)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        cluster.wait_for_nodes()
        yield ray
    finally:
        ray.shutdown()
        cluster.shutdown()


def engines_cli(*argv: str) -> int:
    args = build_parser().parse_args(["engines", *argv])
    return args.func(args)


def test_an_engine_removed_and_one_added_mid_run_lose_nothing(tmp_path, three_nodes):
    run = tmp_path / "run"
    cfg = small_config("--runtime.backend", "ray", "--runtime.num_engines", "2", "--runtime.max_engines", "3",
                       "--sync.transport", "broadcast", "--rollout.max_staleness", "2",
                       "--run.steps", str(STEPS), "--run.checkpoint_every", "0", "--run.save_rollouts", "true",
                       "--runtime.worker_timeout_s", "60",
                       "--runtime.ray_engine_cpus", "1", "--runtime.ray_trainer_cpus", "1",
                       # One group at a time per engine: the engines are the bottleneck, so each
                       # holds queued groups whenever it is removed (and the trainer waits on them).
                       "--engine.max_num_seqs", "4")
    done: dict = {}

    def drive() -> None:
        def wait_steps(n: int) -> bool:
            deadline = time.time() + 120
            while time.time() < deadline:
                if (run / "metrics.jsonl").exists() and len(step_rows(run)) >= n:
                    return True
                time.sleep(0.05)
            return False

        if wait_steps(1):  # both engines still work through the groups admitted at the start
            done["remove_at"] = len(step_rows(run))
            done["remove"] = engines_cli("remove", "--run", str(run), "--engine", "engine0", "--wait", "60")
        if wait_steps(done.get("remove_at", 99) + 1):  # the run goes on while the new engine loads
            done["add_at"] = len(step_rows(run))
            done["add"] = engines_cli("add", "--run", str(run), "--wait", "90")

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    t0 = time.time()
    summary = train(cfg, run)
    driver.join(timeout=5)
    wall = time.time() - t0
    assert done.get("remove") == 0 and done.get("add") == 0, done
    assert done["add_at"] < STEPS - 1, f"the run was nearly over before the engines changed: {done}"
    assert summary["steps"] == STEPS
    assert summary["engines"]["removed"] == ["engine0"] and summary["engines"]["added"] == ["engine2"]
    assert summary["engines"]["final"] == ["engine1", "engine2"]
    rows = step_rows(run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["rollout/count"] == 16 for r in rows)  # whole groups only

    # Exactly once: every admitted prompt was consumed once, or is still in flight at the end.
    consumed = [p for line in ledger(run) for p in line["prompt_ids"]]
    assert len(consumed) == len(set(consumed)) == STEPS * 4
    everything = sorted(consumed + summary["in_flight_prompt_ids"])
    assert everything == list(range(len(everything)))

    events = read_jsonl(run / "engines.jsonl")
    trained = read_jsonl(run / "rollouts.jsonl")
    # engine0's in-flight groups went to the others, and each was trained once, from them.
    readmitted = next(e["groups"] for e in events if e["event"] == "readmitted" and e["engine"] == "engine0")
    assert readmitted, "engine0 held no group when it was removed: the test proved nothing"
    again = [r for r in trained if r["group_id"] in readmitted]
    assert again and {r["engine"] for r in again} <= {"engine1", "engine2"}
    # (the oldest groups in flight: trained long before the end, so none may be missing)
    assert sorted(r["group_id"] for r in again) == sorted(g for g in readmitted for _ in range(4))

    # The added engine: placed on a node of the cluster, got work only after it held the
    # trainer's weights, and every token it generated carries a version it had loaded.
    joined = next(e for e in events if e["event"] == "joined")
    assert joined["engine"] == "engine2" and joined["version"] >= done["add_at"] >= 1
    assert joined["node"] in {n["NodeID"] for n in three_nodes.nodes() if n["Alive"]}
    loaded = [e["version"] for e in events if e["event"] == "loaded" and e["engine"] == "engine2"]
    assert loaded and min(loaded) >= joined["version"] and loaded == sorted(loaded)
    mine = [r for r in trained if r["engine"] == "engine2"]
    assert mine, "the added engine generated nothing that was trained"
    versions = {v for r in mine for v in r["versions"]}
    assert versions <= set(loaded), (versions, loaded)
    assert min(versions) >= joined["version"]
    print(f"elastic run: {STEPS} steps in {wall:.1f}s; removed engine0 at step {done['remove_at']} "
          f"({len(readmitted)} groups re-sent), engine2 joined at version {joined['version']}, "
          f"{len(mine)} of its rollouts trained, versions {sorted(versions)}")
