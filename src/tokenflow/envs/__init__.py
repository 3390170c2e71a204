"""Multi-turn environments and tool use: episodes whose ids are the model's and the template's.

* `Environment` / `StepResult` (`base`): reset → step per assistant turn → close.
* `ToolEnvironment` (`tool_env`): steps that run the tool calls in each turn.
* `tool_calls`: reading and writing calls in the "hermes" and "plain" formats.
* `Rubric` / `group_reward` (`rubric`): weighted reward functions over finished episodes.
* `ChatBridge` (`bridge`): prompt ids, environment ids, turn ends and the prefix check, from the
  model's chat template.
* `Episode` / `play_reference_episodes` (`episode`): the record of an episode and the reference
  driver (`run_episodes`: its old name, a deprecated alias; training drives episodes in
  `tokenflow.runtime.drivers.episodes`).
* `load_environment` (`loading`) and `EnvTask` (`task`): ``task.env`` in the config.
* `CalculatorEnv` (`calculator`): the built-in example the shipped tool model learns.
* `GymEnv` (`gym_adapter`): Gym-style text environments (gymnasium, TextArena, SkyRL-gym) named
  in ``[task.options]``, not imported here (``task.env = "tokenflow.envs.gym_adapter:GymEnv"``).
* `VerifiersEnv` / `play` (`verifiers_env`): ``task.name = "verifiers"``, verifiers environments
  played against training sessions (docs/verifiers.md); not imported here, nor verifiers.

See docs/environments.md.

May import: layers 1-3 and ``tokenflow.tasks`` (an environment task is a task); never
``scoring``, the runtime or a front end.
"""

from tokenflow.envs.base import Environment, StepResult
from tokenflow.envs.bridge import BridgeError, ChatBridge, PrefixCheck
from tokenflow.envs.episode import Episode, Trajectory, play_reference_episodes, run_episodes
from tokenflow.envs.loading import EnvironmentLoadError, load_environment, make_environment
from tokenflow.envs.rubric import Rubric, RubricError, group_reward
from tokenflow.envs.schemas import ToolSchemaError, tool_schema, tool_schemas
from tokenflow.envs.tool_calls import ToolCall, ToolCallError, parse_tool_calls, render_tool_call
from tokenflow.envs.tool_env import ToolEnvironment

__all__ = [
    "BridgeError", "ChatBridge", "Environment", "EnvironmentLoadError", "Episode", "PrefixCheck", "Rubric",
    "RubricError", "StepResult", "ToolCall", "ToolCallError", "ToolEnvironment", "ToolSchemaError", "Trajectory",
    "group_reward", "load_environment", "make_environment", "parse_tool_calls", "play_reference_episodes", "render_tool_call",
    "run_episodes", "tool_schema", "tool_schemas",
]
