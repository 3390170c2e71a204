"""The environment preflight (`preflight.check_environment`) with real tokenizers: a template
that drops the environment's tools is said once, naming the environment and the template; the
tool model's template, which renders them, is not."""

from __future__ import annotations

import logging

from tests.envs.chat_template_testlib import SMOLLM2_STOCK
from tokenflow.envs.task import EnvTask
from tokenflow.model_store import resolve_model_path
from tokenflow.runtime.run.preflight import check_environment

CALC = "tokenflow.envs.calculator:CalculatorEnv"


def test_dropped_tools_are_said_once_naming_the_environment_and_the_template(caplog):
    from transformers import AutoTokenizer

    stock = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m-instruct"))
    stock.chat_template = SMOLLM2_STOCK
    tool_model = AutoTokenizer.from_pretrained(resolve_model_path("default-tool"))
    task = EnvTask(CALC, num_eval=4)
    with caplog.at_level(logging.WARNING):
        check_environment(task, tool_model)
        check_environment(task, stock)
        check_environment(task, stock)
    dropped = [r.getMessage() for r in caplog.records if "never sees them" in r.getMessage()]
    assert len(dropped) == 1, dropped
    assert dropped[0].startswith(f"environment {CALC}: the chat template of ")
    assert "smollm2-135m-instruct renders neither the tools offered" in dropped[0]
