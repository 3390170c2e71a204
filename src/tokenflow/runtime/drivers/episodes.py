"""Multi-turn episodes on top of any `RolloutEngine`: token in, token out.

    Generate(episode) ─► reset (env thread) ─► prompt ids ─► engine turn ─► env.step (env thread)
                                                    ▲                             │
                                                    └── resume = rollout + environment ids ◄─┘

One episode is one sample of a group. Its model turns are engine requests that continue the
sequence from its exact token ids (``add_request(resume=...)``), so nothing the engine sampled is
ever decoded and re-encoded for training: the assistant text is decoded only for the
environment to read, and the environment's reply enters as the chat template's difference
(`tokenflow.envs.bridge.ChatBridge.environment_ids`), with loss mask 0.

Environment work (``reset``, ``step``) runs on one asyncio loop in a background thread, so
decoding never waits on a tool. Each call has a deadline kept here, on the engine side: an
environment that raises, hangs or blocks its loop fails its own sample (``info["env_error"]``)
and the group still completes. The driver never blocks: the engine worker calls `poll` between
engine steps and gets back the groups whose every episode has ended.

With a chat template that does not preserve prefixes (it rewrites earlier turns, as templates
that strip reasoning do), the sequence the engine continues would differ from what the template
renders for the same conversation. The driver then starts a new training row at every turn,
prompted with the template's own rendering, and counts it (``episode/new_rows``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import numpy as np

from tokenflow.rollout import Rollout
from tokenflow.runtime.drivers.drive import picklable, seed_of, tools_key
from tokenflow.runtime.drivers.env_loop import EnvLoop
from tokenflow.runtime.drivers.episode_state import EpisodeSpec, RunningEpisode

__all__ = ["EpisodeDriver", "EpisodeSpec", "run_episodes"]

log = logging.getLogger(__name__)

GRACE_S = 0.5
"""Beyond its own deadline, how long a call may take before the driver gives up on it (the
asyncio timeout inside the loop normally fires first; this catches a loop that is blocked)."""


def _load_env_class(spec: str, options: dict):
    from tokenflow.envs import load_environment

    # The task checked the keys against the parts it uses; here the constructor must be buildable.
    return load_environment(spec, options, examples=True)


class EpisodeDriver:
    """Runs the episodes of environment requests on ``engine`` (see the module docstring)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        if self.tokenizer is None:
            raise ValueError("environment tasks need the model's tokenizer (with a chat template) "
                             "in the model folder")
        self._loop: EnvLoop | None = None
        self._classes: dict[str, type] = {}
        self._requests: dict[str, tuple[object, list[RunningEpisode]]] = {}
        """request id -> (base SamplingParams, its n episodes)."""
        self._by_key: dict[str, RunningEpisode] = {}
        """engine request id -> its episode."""
        self._preserves: dict[str, tuple[bool, str]] = {}

    # ---- requests ----------------------------------------------------------------------------
    def owns(self, request_id: str) -> bool:
        """Whether ``request_id`` (a group's) is one of this driver's."""
        return request_id in self._requests

    def handles(self, r: Rollout) -> bool:
        """Whether the engine's rollout ``r`` is a turn of one of this driver's episodes."""
        return r.request_id in self._by_key

    def start(self, request_id: str, spec: EpisodeSpec, params, group_id: int, prompt_id: int) -> None:
        """Begin the ``params.n`` episodes of one request: each environment resets on the env
        thread; its first turn is queued when the reset lands (`poll`)."""
        if self._loop is None:
            self._loop = EnvLoop()
        cls = self._classes.get(spec.env)
        if cls is None:
            cls = self._classes[spec.env] = _load_env_class(spec.env, spec.options)
        from tokenflow.envs import Episode

        episodes = []
        for i in range(params.n):
            ep = RunningEpisode(request_id, i, group_id, prompt_id, seed=seed_of(params, i), record=Episode(spec.example))
            ep.max_turns = spec.max_turns or int(getattr(cls, "max_turns", 1))
            episodes.append(ep)
            self._by_key[ep.engine_rid] = ep
            self._call(ep, "reset", lambda: self._reset(cls, spec.example, spec.options), spec.step_timeout_s)
        self._requests[request_id] = (params, episodes, spec)

    async def _reset(self, cls, example: dict, options: dict):
        from tokenflow.envs import make_environment

        env = make_environment(cls, options)
        messages, tools = await asyncio.to_thread(env.reset, example)
        return env, list(messages), list(tools or [])

    def abort(self, request_id: str) -> None:
        """Stop a request's episodes: their engine samples and their environments."""
        entry = self._requests.pop(request_id, None)
        if entry is None:
            return
        for ep in entry[1]:
            self._by_key.pop(ep.engine_rid, None)
            self.engine.abort(ep.engine_rid)
            if ep.future is not None:
                self._loop.cancel(ep.future)
            self._close_env(ep)

    @property
    def waiting_on_env(self) -> bool:
        """Whether some episode waits for its environment (the worker then polls often)."""
        return any(ep.future is not None for ep in self._by_key.values())

    # ---- engine side -------------------------------------------------------------------------
    def pump(self) -> None:
        """Nothing to admit from outside the engine's thread (the agents' driver has calls)."""

    def dispatch(self, finished: list[Rollout]) -> list[Rollout]:
        """Take the episodes' turns out of one engine step's rollouts; returns the others."""
        others = []
        for r in finished:
            if self.handles(r):
                self.on_turn(r)
            else:
                others.append(r)
        return others

    def on_turn(self, r: Rollout) -> None:
        """The engine finished (or aborted) one model turn of an episode."""
        ep = self._by_key.get(r.request_id)
        if ep is None or ep.done:
            return
        params = self._requests[ep.request_id][0]
        if r.finish_reason == "abort":  # an abort-mode weight swap: continue this very turn
            self.engine.add_request(ep.prompt_ids, dataclasses.replace(params, n=1, seed=ep.seed,
                                                                       max_tokens=self._budget(ep, r)),
                                    request_id=ep.engine_rid, resume=r)
            return
        ep.rollout = r
        ep.record.turns += 1
        turn_ids = r.completion_ids[self._turn_start(r):].tolist()
        raw = ep.bridge.assistant_message(turn_ids)  # decoded to be read, never encoded again
        try:
            message = ep.env.parse(raw)
        except Exception as e:  # noqa: BLE001 - a user environment may raise anything
            ep.record.record(raw, None)
            self._fail(ep, f"environment parse raised {type(e).__name__}: {e}")
            return
        if not ep.bridge.ends_turn(turn_ids):  # out of tokens, or an EOS that is not a turn end
            ep.record.record(message, None)
            ep.record.truncated = True
            ep.finish = self._length_reason(ep, r) if r.finish_reason == "length" else "stop"
            return
        ep.last_message = message
        spec = self._requests[ep.request_id][2]
        env = ep.env
        self._call(ep, "step", lambda: env.step(raw), spec.step_timeout_s)

    def _turn_start(self, r: Rollout) -> int:
        """Index in ``r.completion_ids`` where the last model turn starts."""
        if r.turns is None:
            return 0
        mask = r.loss_mask
        last = int(r.turns[-1])
        idx = np.nonzero((r.turns == last) & (mask > 0))[0]
        return int(idx[0]) if len(idx) else len(r.completion_ids)

    def _length_reason(self, ep: RunningEpisode, r: Rollout) -> str:
        spec = self._requests[ep.request_id][2]
        if len(r.prompt_ids) + r.num_tokens >= self.engine.max_model_len:
            return "context_length"
        if r.num_tokens >= spec.max_total_tokens:
            return "token_limit"
        return "length"

    def _budget(self, ep: RunningEpisode, r: Rollout) -> int:
        """``max_tokens`` of a continuation: the completion so far plus what this turn may add."""
        params, _, spec = self._requests[ep.request_id]
        turn = self._turn_budget(params)
        return r.num_tokens + max(1, min(turn, spec.max_total_tokens - r.num_tokens))

    @staticmethod
    def _turn_budget(params) -> int:
        return int(params.max_tokens)  # sampling.max_tokens bounds each model turn

    # ---- environment side --------------------------------------------------------------------
    def _call(self, ep: RunningEpisode, what: str, make_coro, timeout: float) -> None:
        ep.pending = what
        ep.deadline = time.monotonic() + timeout + GRACE_S
        ep.future = self._loop.submit(make_coro, timeout)

    def poll(self) -> list[tuple[str, list[Rollout]]]:
        """Handle environment results that landed; return ``(request id, rows)`` of every
        request whose episodes have all ended."""
        now = time.monotonic()
        for ep in list(self._by_key.values()):
            fut = ep.future
            if fut is None:
                continue
            if not fut.done():
                if now > ep.deadline:  # the env loop itself is stuck: give up on this one
                    self._loop.cancel(fut)
                    ep.future = None
                    self._fail(ep, f"environment {ep.pending} did not return (the env loop is blocked)")
                continue
            ep.future = None
            try:
                result = fut.result()
            except (asyncio.TimeoutError, TimeoutError):
                self._fail(ep, f"environment {ep.pending} exceeded its {self._timeout(ep):g}s "
                               "(episode.step_timeout_s)")
                continue
            except Exception as e:  # noqa: BLE001 - a user environment may raise anything
                self._fail(ep, f"environment {ep.pending} raised {type(e).__name__}: {e}")
                continue
            try:
                if ep.pending == "reset":
                    self._on_reset(ep, *result)
                else:
                    self._on_step(ep, result)
            except Exception as e:  # noqa: BLE001 - bad observations, a template that fails...
                self._fail(ep, f"after environment {ep.pending}: {type(e).__name__}: {e}")
        return self._finished_requests()

    def _timeout(self, ep: RunningEpisode) -> float:
        return self._requests[ep.request_id][2].step_timeout_s

    def _on_reset(self, ep: RunningEpisode, env, messages: list[dict], tools: list) -> None:
        from tokenflow.envs.bridge import ChatBridge

        ep.env = env
        ep.record.messages = list(messages)
        ep.bridge = ChatBridge(self.tokenizer, tools=tools or None)
        self._check_template(ep)
        ep.prompt_ids = list(ep.bridge.prompt_ids(ep.record.messages))
        self._submit_turn(ep, None)

    def _check_template(self, ep: RunningEpisode) -> None:
        """The prefix rule, checked once per set of tools (it can depend on how tools render)."""
        key = tools_key(ep.bridge)
        if key not in self._preserves:
            check = ep.bridge.prefix_check()
            self._preserves[key] = (check.ok, check.reason)
            if not check.ok:
                log.warning("the chat template does not preserve prefixes (%s): every model turn starts "
                            "a new training row, prompted with the template's own rendering", check.reason)

    def _preserving(self, ep: RunningEpisode) -> bool:
        return self._preserves.get(tools_key(ep.bridge), (True, ""))[0]

    def _on_step(self, ep: RunningEpisode, result) -> None:
        from tokenflow.envs import StepResult

        if not isinstance(result, StepResult):
            observations, reward, done, info = result  # a plain 4-tuple is accepted too
            result = StepResult(list(observations or []), reward, bool(done), dict(info or {}))
        last = ep.turns >= ep.max_turns
        # At the turn limit an unfinished episode is cut: its observations would answer nothing.
        ep.record.record(ep.last_message, result, keep_observations=result.done or not last)
        if result.done:
            ep.finish = "stop"
            return
        if last:
            ep.record.truncated = True
            ep.finish = "max_turns"
            return
        observations = list(result.observations)
        if not self._preserving(ep):
            ep.rows.append(ep.rollout)
            ep.prompt_ids = list(ep.bridge.prompt_ids(ep.record.messages))
            if len(ep.prompt_ids) >= self.engine.max_model_len - 1:
                ep.rollout, ep.finish = ep.rows.pop(), "context_length"
                return
            self._submit_turn(ep, None)
            return
        env_ids = list(ep.bridge.environment_ids(observations, assistant=ep.last_message))
        r = ep.rollout
        spec = self._requests[ep.request_id][2]
        if len(r.prompt_ids) + r.num_tokens + len(env_ids) >= self.engine.max_model_len - 1:
            ep.finish = "context_length"
            return
        if r.num_tokens + len(env_ids) >= spec.max_total_tokens:
            ep.finish = "token_limit"
            return
        self._submit_turn(ep, r.append_environment(env_ids))

    def _submit_turn(self, ep: RunningEpisode, resume: Rollout | None) -> None:
        params, _, spec = self._requests[ep.request_id]
        stop = tuple(dict.fromkeys([*params.stop_token_ids, *ep.bridge.turn_end_ids]))
        turn = self._turn_budget(params)
        if resume is None:  # a first turn (or a new row): the whole budget of one turn
            max_tokens = min(turn, spec.max_total_tokens - sum(r.num_tokens for r in ep.rows))
        else:
            max_tokens = self._budget(ep, resume)
        p = dataclasses.replace(params, n=1, seed=ep.seed, max_tokens=max(1, max_tokens),
                                stop_token_ids=stop, park_kv=ep.turns + 1 < ep.max_turns)
        self.engine.add_request(ep.prompt_ids, p, request_id=ep.engine_rid, resume=resume,
                                group_id=ep.group_id, prompt_id=ep.prompt_id)

    # ---- endings ------------------------------------------------------------------------------
    def _fail(self, ep: RunningEpisode, why: str) -> None:
        ep.error = why
        ep.finish = ep.finish or "error"
        log.warning("episode %s/%d failed: %s", ep.request_id, ep.index, why)

    def _finished_requests(self) -> list[tuple[str, list[Rollout]]]:
        out = []
        for rid, (params, episodes, spec) in list(self._requests.items()):
            if not all(ep.done for ep in episodes):
                continue
            rows = []
            for ep in episodes:
                rows.extend(self._rows_of(ep))
                self._by_key.pop(ep.engine_rid, None)
                self.engine.abort(ep.engine_rid)  # nothing runs: this frees its parked KV cache
                self._close_env(ep)
            del self._requests[rid]
            out.append((rid, rows))
        return out

    def _rows_of(self, ep: RunningEpisode) -> list[Rollout]:
        rows = [*ep.rows, *([ep.rollout] if ep.rollout is not None else [])]
        if not rows:  # failed before its first turn: an empty, failed row keeps the group whole
            rows = [Rollout(prompt_ids=ep.prompt_ids or [0], completion_ids=[], logprobs=[], versions=[],
                            request_id=ep.request_id, sample_index=ep.index, group_id=ep.group_id,
                            prompt_id=ep.prompt_id)]
        ep.record.state = picklable(getattr(ep.env, "state", {}) or {})
        summary = {"env": self._requests[ep.request_id][2].env, "episode": ep.record, "turns": ep.turns,
                   "finish": ep.finish, "info": ep.record.info, "error": ep.error, "rows": len(rows)}
        for k, r in enumerate(rows):
            r.request_id, r.sample_index = ep.request_id, ep.index
            r.group_id, r.prompt_id = ep.group_id, ep.prompt_id
            r.info = {**r.info, "episode": summary, "row": k}
            if ep.error is not None:
                r.failed = True
                r.info["env_error"] = ep.error
        rows[-1].finish_reason = ep.finish if ep.finish != "error" else rows[-1].finish_reason
        return rows

    def _close_env(self, ep: RunningEpisode) -> None:
        env, ep.env = ep.env, None
        if env is not None and hasattr(env, "close"):
            try:
                env.close()
            except Exception as e:  # noqa: BLE001 - closing must not take the engine down
                log.warning("environment close() raised %s: %s", type(e).__name__, e)

    def close(self) -> None:
        for rid in list(self._requests):
            self.abort(rid)
        if self._loop is not None:
            self._loop.close()


def run_episodes(engine, specs: list[EpisodeSpec], params, on_progress=None) -> list[list[Rollout]]:
    """Blocking: run one request of ``params.n`` episodes per spec on ``engine`` and return each
    request's rows (for `tokenflow eval`, tests and scripts; the runtime drives episodes from
    the engine worker's loop instead)."""
    from tokenflow.runtime.drivers.drive import drive

    return drive(EpisodeDriver(engine), engine, specs, params, on_progress)
