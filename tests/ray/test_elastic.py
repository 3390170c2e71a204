"""Elastic engines on a multi-node local Ray cluster: an engine removed and one added mid-run by
`tokenflow engines` (broadcast sync across nodes), an engine added by ``runtime.elastic`` while
the trainer waits on generation (shared memory on one node); nothing lost or repeated, the added
engines' tokens tagged with the versions they really loaded."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.ray.elastic_testlib import exactly_once, joined_with_its_versions, run_config
from tests.runtime.runtime_testlib import step_rows
from tokenflow.cli.main import build_parser
from tokenflow.metrics.sinks import read_jsonl
from tokenflow.runtime.launch import train
from tokenflow.runtime.run.control import read_status

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # a real run on three Ray nodes; a lost group would hang it

STEPS = 40


@pytest.fixture(scope="module")
def three_nodes():
    """Three Ray nodes (raylets) on this machine with 1 + 1 + 3 logical CPUs: room for a trainer and
    three engines spread over them, or for a trainer and two engines on one node (shared memory)."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    for cpus in (1, 3):
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


def test_an_engine_removed_and_one_added_mid_run_lose_nothing(tmp_path, three_nodes, capsys):
    run = tmp_path / "run"
    cfg = run_config("--runtime.num_engines", "2", "--runtime.max_engines", "3", "--sync.transport", "broadcast",
                     "--run.steps", str(STEPS))
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
            done["list"] = engines_cli("list", "--run", str(run), "--json")
            # Refused, and nothing changes: past max_engines, below min_engines, an unknown name.
            done["refused"] = [engines_cli(*argv, "--run", str(run), "--wait", "20", "--json") for argv in (
                ("add", "--count", "2"), ("remove", "--count", "2"), ("remove", "--engine", "engine7"))]

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    t0 = time.time()
    summary = train(cfg, run)
    driver.join(timeout=5)
    wall = time.time() - t0
    assert done.get("remove") == 0 and done.get("add") == 0 and done.get("refused") == [1, 1, 1] \
        and done.get("list") == 0, done
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    listed, replies = printed[0], printed[1:]
    assert [(e["name"], e["accepting"]) for e in listed["engines"]] == [("engine1", True), ("engine2", True)]
    assert listed["removed"] == ["engine0"] and listed["max_engines"] == 3
    assert [r["message"] for r in replies] == [
        "that would make 4 engines; runtime.max_engines is 3",
        "that would leave 0 engine(s); runtime.min_engines is 1",
        "no engine 'engine7' runs now (the engines: engine1, engine2)"], replies
    assert done["add_at"] < STEPS - 1, f"the run was nearly over before the engines changed: {done}"
    assert summary["engines"]["removed"] == ["engine0"] and summary["engines"]["added"] == ["engine2"]
    assert summary["engines"]["final"] == ["engine1", "engine2"]
    exactly_once(run, summary, STEPS)

    events = read_jsonl(run / "engines.jsonl")
    trained = read_jsonl(run / "rollouts.jsonl")
    # engine0's in-flight groups went to the others, and each was trained once, from them (the
    # oldest groups in flight: trained long before the end, so none may be missing).
    readmitted = next(e["groups"] for e in events if e["event"] == "readmitted" and e["engine"] == "engine0")
    assert readmitted, "engine0 held no group when it was removed: the test proved nothing"
    again = [r for r in trained if r["group_id"] in readmitted]
    assert {r["engine"] for r in again} <= {"engine1", "engine2"}
    assert sorted(r["group_id"] for r in again) == sorted(g for g in readmitted for _ in range(4))

    # The added engine: placed on a node of the cluster, got work only after it held the
    # trainer's weights, and every token it generated carries a version it had loaded.
    joined, versions = joined_with_its_versions(run, "engine2")
    assert joined["version"] >= done["add_at"]
    assert joined["node"] in {n["NodeID"] for n in three_nodes.nodes() if n["Alive"]}
    mine = [r for r in trained if r["engine"] == "engine2"]
    print(f"elastic run: {STEPS} steps in {wall:.1f}s; removed engine0 at step {done['remove_at']} "
          f"({len(readmitted)} groups re-sent), engine2 joined at version {joined['version']}, "
          f"{len(mine)} of its rollouts trained, versions {sorted(versions)}")


def test_runtime_elastic_adds_an_engine_while_the_trainer_waits_on_generation(tmp_path, three_nodes):
    # Shared memory: the trainer and its engines on one node (the 3-CPU one); the added engine is
    # pinned there too. One engine cannot keep up with the trainer, so it waits on generation.
    # Once the rule's engine has joined, the first engine is removed by hand: the shared-memory
    # slots are rebuilt for one reader while it still holds groups.
    run = tmp_path / "run"
    steps = 30
    cfg = run_config("--runtime.elastic", "true", "--runtime.max_engines", "2", "--runtime.elastic_patience", "2",
                     "--sync.transport", "shared_memory", "--runtime.ray_placement_strategy", "STRICT_PACK",
                     "--run.steps", str(steps))
    done: dict = {}

    def remove_the_first_engine_once_the_second_joined() -> None:
        deadline = time.time() + 120
        while time.time() < deadline:
            log = run / "engines.jsonl"
            if log.exists() and any(e["event"] == "joined" for e in read_jsonl(log)):
                done["nodes"] = {e["name"]: e["node"] for e in read_status(run)["engines"]}
                done["remove"] = engines_cli("remove", "--run", str(run), "--engine", "engine", "--wait", "60")
                return
            time.sleep(0.05)

    driver = threading.Thread(target=remove_the_first_engine_once_the_second_joined, daemon=True)
    driver.start()
    summary = train(cfg, run)
    driver.join(timeout=5)
    exactly_once(run, summary, steps)
    events = read_jsonl(run / "engines.jsonl")
    decided = [e for e in events if e["event"] == "decided"]
    assert decided and decided[0]["op"] == "add" and "the trainer waited on generation" in decided[0]["why"], decided
    assert summary["engines"]["added"][:1] == ["engine1"]
    joined, versions = joined_with_its_versions(run, "engine1")
    assert joined["why"] == decided[0]["why"]
    assert joined["node"] == done["nodes"]["engine"]  # shared memory: beside the trainer
    assert done["remove"] == 0 and "engine" in summary["engines"]["removed"], (done, summary["engines"])
    readmitted = next(e["groups"] for e in events if e["event"] == "readmitted" and e["engine"] == "engine")
    again = [r for r in read_jsonl(run / "rollouts.jsonl") if r["group_id"] in readmitted]
    assert readmitted and {r["engine"] for r in again} <= {"engine1", "engine2"}
    assert sorted(r["group_id"] for r in again) == sorted(g for g in readmitted for _ in range(4))
    print(f"runtime.elastic: {[(e['op'], e['step'], e['why']) for e in decided]}; engine1 joined at version "
          f"{joined['version']} (step {joined['step']}), versions {sorted(versions)}; engine removed with "
          f"{len(readmitted)} groups re-sent; final {summary['engines']}")
