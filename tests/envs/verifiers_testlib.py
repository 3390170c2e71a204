"""verifiers pieces for the tests of `tokenflow.envs.verifiers_env`: a taskset whose scoring
raises (verifiers imports this module by its name, ``verifiers_testlib``, from this folder), and
whose harness can hang, and an agent function that plays an episode as `play` does and keeps verifiers' own record of it."""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

import verifiers.v1 as vf

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "verifiers"))
from tf_vf_chat import ChatData, ChatHarness  # noqa: E402

TRACES: dict[str, list[dict]] = {}
"""verifiers' record of each episode `recording_play` played, by session base URL."""
_lock = threading.Lock()


class SlowHarness(ChatHarness):
    """The chat harness, except that a task whose prompt is "sleep" never returns."""

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **kw):
        if data.prompt == "sleep":
            await asyncio.sleep(3600)
        return await super().launch(ctx, trace, runtime, endpoint, secret, mcp_urls, data, **kw)


class RaisingTask(vf.Task[ChatData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def broken(self, task, trace) -> float:
        raise RuntimeError("this reward function is broken")


class RaisingTaskset(vf.Taskset[RaisingTask, vf.TasksetConfig]):
    def load(self):
        for i in range(4):
            prompt = "sleep" if i == 1 else f"Say {i}."
            yield RaisingTask(ChatData(prompt=prompt, answers=[str(i)]), self.config.task)


async def recording_play(base_url: str, example: dict) -> dict:
    """`tokenflow.envs.verifiers_env.play`, keeping each trace's token ids, sampled mask and
    log-probs as verifiers recorded them."""
    from tokenflow.envs import verifiers_env

    options = example["vf_options"]
    loaded = verifiers_env.load(options["env"], options.get("args"), options.get("env_config"), options.get("limit"))
    ctx = vf.ModelContext(model="policy", client=verifiers_env.client_config(base_url, options["renderer_model"]))
    episode = await loaded.env.run_episode(loaded.tasks[example["vf_index"]], ctx)
    branch = episode.traces[0].branches[-1]
    with _lock:
        TRACES.setdefault(base_url, []).append({"token_ids": list(branch.token_ids),
                                                "sampled": list(branch.sampled_mask),
                                                "logprobs": list(branch.logprobs)})
    return verifiers_env.episode_result(episode)


__all__ = ["RaisingTaskset", "SlowHarness"]
