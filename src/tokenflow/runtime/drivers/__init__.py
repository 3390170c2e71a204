"""Rollout drivers: what turns a ``Generate`` into rollouts beyond a single completion, inside the
engine worker, on any `RolloutEngine`.

* ``episodes``: multi-turn environment episodes, token in, token out (``episode_state`` holds
  what one running episode keeps);
* ``agents``: any code that talks to an OpenAI endpoint, played through recording sessions;
* ``env_loop``: the asyncio loop environments and agents run on; ``drive``: what both share,
  and the blocking loop that runs either in-process (``tokenflow eval``, tests, scripts).

May import: layers 1-4 (engine, envs, serve, ...) and ``runtime.view``.
"""
