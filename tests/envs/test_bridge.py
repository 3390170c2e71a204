"""ChatBridge on real chat templates: bridged ids equal the template's rendering of the whole
conversation, turn ends are found by rendering, and templates that rewrite earlier turns are caught."""

from __future__ import annotations

import json

import pytest

from tests.envs.chat_template_testlib import (
    THINK_STRIPPING, llama3_1_tokenizer, mistral_v0_3_tokenizer, qwen2_5_tokenizer,
)
from tokenflow.envs import BridgeError, ChatBridge, ToolSchemaError
from tokenflow.envs.calculator import add, mul


def tool_call(i: int, name: str, args: dict) -> dict:
    return {"id": f"call{i:05d}", "type": "function", "function": {"name": name, "arguments": args}}


# What each model writes for its tool calls and answers: the text between the generation prompt
# and the turn end in its template's rendering (the model samples it; it is never re-rendered).
def qwen_turn(calls, content=""):
    parts = [content] if content else []
    parts += ['<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>'
              % (c["function"]["name"], json.dumps(c["function"]["arguments"])) for c in calls]
    return "\n".join(parts)


def llama_turn(calls, content=""):
    if calls:
        (c,) = calls
        return '{"name": "%s", "parameters": %s}' % (c["function"]["name"], json.dumps(c["function"]["arguments"]))
    return content


def mistral_turn(calls, content=""):
    if calls:
        return "[TOOL_CALLS] [" + ", ".join('{"name": "%s", "arguments": %s, "id": "%s"}' % (
            c["function"]["name"], json.dumps(c["function"]["arguments"]), c["id"]) for c in calls) + "]"
    return " " + content


FAMILIES = {
    "qwen2.5": (qwen2_5_tokenizer, qwen_turn, "<|im_end|>", True),
    "llama3.1": (llama3_1_tokenizer, llama_turn, "<|eot_id|>", False),
    "mistral-v0.3": (mistral_v0_3_tokenizer, mistral_turn, "</s>", True),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_bridged_ids_equal_the_templates_rendering_of_the_whole_conversation(family):
    make, write, end_token, parallel_calls = FAMILIES[family]
    tok = make()
    bridge = ChatBridge(tok, [mul, add])
    assert [tok.convert_ids_to_tokens(t) for t in bridge.turn_end_ids] == [end_token]
    assert bridge.preserves_prefixes(("tool",))

    first = [tool_call(0, "mul", {"a": 12, "b": 34}), tool_call(1, "mul", {"a": 5, "b": 6})][:2 if parallel_calls else 1]
    turns = [(first, ["408", "30"][:len(first)]),
             ([tool_call(2, "add", {"a": 408, "b": 56})], ["464"]),
             ([], None)]
    conversation = [{"role": "user", "content": "What is 12*34+56?"}]
    ids = bridge.prompt_ids(conversation)
    sampled = []  # (start, end) of each model turn in ids
    for calls, results in turns:
        message = ({"role": "assistant", "content": "", "tool_calls": calls} if calls
                   else {"role": "assistant", "content": "The answer is 464."})
        model_ids = tok.encode(write(calls, message["content"]), add_special_tokens=False) + [bridge.turn_end_ids[0]]
        sampled.append((len(ids), len(ids) + len(model_ids)))
        ids += model_ids
        conversation.append(message)
        if results:
            observations = [{"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"], "content": r}
                            for c, r in zip(calls, results)]
            ids += bridge.environment_ids(observations, assistant=message)
            conversation += observations

    rendered = tok.apply_chat_template(conversation, tools=bridge.schemas, tokenize=True, return_dict=False)
    # The rollout ends at the model's last turn end; the template may write more after it (ChatML's
    # "\n"), which no one samples.
    assert rendered[:len(ids)] == ids
    assert tok.decode(rendered[len(ids):]) in ("", "\n")
    for start, stop in sampled:
        assert ids[stop - 1] == bridge.turn_end_ids[0] and bridge.turn_end_ids[0] not in ids[start:stop - 1]


def test_what_chatml_writes_after_the_turn_end_starts_the_environment_ids():
    tok = qwen2_5_tokenizer()
    bridge = ChatBridge(tok, [mul])
    env_ids = bridge.environment_ids([{"role": "tool", "tool_call_id": "call00000", "name": "mul", "content": "6"}])
    assert tok.decode(env_ids) == "\n<|im_start|>user\n<tool_response>\n6\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    # Without tools, a user observation: the same rule.
    plain = ChatBridge(tok)
    assert tok.decode(plain.environment_ids([{"role": "user", "content": "again"}])) == \
        "\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"


def test_the_turn_end_is_the_first_special_token_after_the_content():
    # A template that writes two special tokens after each turn: the model stops on the first,
    # so the second is the environment's.
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|><|endoftext|>{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tok = qwen2_5_tokenizer()
    bridge = ChatBridge(tok, chat_template=template)
    assert tok.convert_ids_to_tokens(list(bridge.turn_end_ids)) == ["<|im_end|>"]
    assert tok.decode(bridge.environment_ids([{"role": "user", "content": "more"}])) == \
        "<|endoftext|><|im_start|>user\nmore<|im_end|><|endoftext|><|im_start|>assistant\n"


def test_prompt_ids_are_the_templates_ids_as_a_plain_list():
    tok = llama3_1_tokenizer()
    bridge = ChatBridge(tok, [mul])
    messages = [{"role": "user", "content": "6*7?"}]
    ids = bridge.prompt_ids(messages)
    assert type(ids) is list and all(type(t) is int for t in ids)
    # transformers 5 returns a BatchEncoding by default; the bridge returns the ids in it.
    assert ids == tok.apply_chat_template(messages, tools=bridge.schemas, add_generation_prompt=True)["input_ids"]


def test_assistant_message_decodes_a_turn_without_its_turn_end():
    tok = qwen2_5_tokenizer()
    bridge = ChatBridge(tok, [mul])
    text = '<tool_call>\n{"name": "mul", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    turn = tok.encode(text, add_special_tokens=False) + list(bridge.turn_end_ids)
    assert bridge.assistant_message(turn) == {"role": "assistant", "content": text}
    assert bridge.ends_turn(turn) and not bridge.ends_turn(turn[:-1])


def test_templates_that_rewrite_earlier_turns_are_detected():
    think = ChatBridge(qwen2_5_tokenizer(THINK_STRIPPING))
    check = think.prefix_check()
    assert not check and not think.preserves_prefixes()
    assert "assistant message 2" in check.reason and "message 3 (user)" in check.reason and "<think" in check.reason
    assert think.preserves_prefixes(("tool",))  # tool results alone never strip the reasoning

    # Mistral v0.3 moves its tool list before the last user message.
    mistral = ChatBridge(mistral_v0_3_tokenizer(), [mul])
    assert not mistral.preserves_prefixes() and "[AVAILABLE_TOOLS]" in mistral.prefix_check().reason
    with pytest.raises(BridgeError, match="does not preserve prefixes for these messages"):
        mistral.environment_ids([{"role": "user", "content": "and 8*9?"}])
    # Without tools it keeps its prefixes.
    assert ChatBridge(mistral_v0_3_tokenizer()).preserves_prefixes()

    for make in (qwen2_5_tokenizer, llama3_1_tokenizer):
        assert ChatBridge(make(), [mul, add]).preserves_prefixes()


def test_templates_the_bridge_cannot_use_are_refused_with_the_reason():
    tok = qwen2_5_tokenizer()
    no_end = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
    with pytest.raises(BridgeError, match="no special token follows the content of an assistant turn"):
        ChatBridge(tok, chat_template=no_end)
    # A generation prompt the assistant turn does not start with.
    odd = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}"
           "{% if add_generation_prompt %}<|im_start|>model\n{% endif %}")
    with pytest.raises(BridgeError, match="generation prompt is not a prefix"):
        ChatBridge(tok, chat_template=odd)
    bare = qwen2_5_tokenizer.__wrapped__()
    bare.chat_template = None
    with pytest.raises(BridgeError, match="has no chat template"):
        ChatBridge(bare)


def test_tools_without_docstrings_or_hints_are_named():
    def divide(a: int, b: int) -> float:
        return a / b

    def scale(x, by: float) -> float:
        """Scale.

        Args:
            x: value
            by: factor
        """
        return x * by

    with pytest.raises(ToolSchemaError, match=r"tool .*divide: .*no docstring.*Args:"):
        ChatBridge(qwen2_5_tokenizer(), [divide])
    with pytest.raises(ToolSchemaError, match=r"tool .*scale: Argument x is missing a type hint"):
        ChatBridge(qwen2_5_tokenizer(), [scale])


# Verdicts and refusals word for word: the prefix check's reasons (kept and rewritten), a template
# that cannot render a role, a request's own tool schemas, and decoding a turn.
NO_TOOL_ROLE = ("{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tool role here') }}{% endif %}"
                "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_the_prefix_check_names_the_conversation_it_rendered():
    tok = qwen2_5_tokenizer()
    assert ChatBridge(tok, [mul, add]).prefix_check().reason == \
        "each rendering of [user, assistant, tool, assistant, user, assistant] is a token prefix of the next"
    assert ChatBridge(tok).prefix_check(("tool",)).reason == "each rendering of [user, assistant] is a token prefix of the next"


def test_a_rewriting_template_is_named_with_the_turns_and_tokens_that_differ():
    check = ChatBridge(qwen2_5_tokenizer(THINK_STRIPPING)).prefix_check()
    assert check.ok is False and not check
    assert check.reason == (
        "the conversation through assistant message 2 is not a token prefix of the conversation through the prompt "
        "after message 3 (user) (token 13: '<think' became '42<|im_end|>\\n<|im_start|>u'): the template rewrites "
        "earlier turns, so each model turn must be trained as its own row")
    mistral = ChatBridge(mistral_v0_3_tokenizer(), [mul])
    assert mistral.prefix_check().reason.startswith(
        "the conversation through assistant message 4 is not a token prefix of the conversation through the prompt "
        "after message 5 (user) (token 1: ")
    with pytest.raises(BridgeError) as e:
        mistral.environment_ids([{"role": "user", "content": "and 8*9?"}])
    assert str(e.value) == (
        "appending [user] changes how the assistant turn before them renders (token 1: '[AVAILABLE_TOOLS] [{\"ty' "
        "became '[INST] 7[/INST] 7</s>[AVAILABLE_TOOLS]'); this template does not preserve prefixes for these messages")


def test_a_role_the_template_cannot_render_is_a_failed_check_and_a_refusal():
    bridge = ChatBridge(qwen2_5_tokenizer(), [mul], chat_template=NO_TOOL_ROLE)
    why = "the chat template cannot render a conversation of roles [user, assistant, tool]: TemplateError: no tool role here"
    check = bridge.prefix_check()
    assert (check.ok, check.reason) == (False, why)
    with pytest.raises(BridgeError) as e:
        bridge.environment_ids([{"role": "tool", "tool_call_id": "call00000", "name": "mul", "content": "6"}])
    assert str(e.value) == why
    assert bridge.prefix_check(("user",))  # without tool messages it renders, and keeps its prefixes


def test_a_requests_tool_schemas_replace_the_bridges_own():
    tok = qwen2_5_tokenizer()
    schemas = ChatBridge(tok, [mul]).schemas
    plain = ChatBridge(tok)
    messages = [{"role": "user", "content": "6*7?"}]
    with_tools = plain.prompt_ids(messages, schemas=schemas)
    assert with_tools == tok.apply_chat_template(messages, tools=schemas, add_generation_prompt=True, tokenize=True,
                                                 return_dict=False)
    assert with_tools != plain.prompt_ids(messages) and '"name": "mul"' in tok.decode(with_tools)
    # offered at construction instead, the same ids
    assert ChatBridge(tok, schemas=schemas).prompt_ids(messages) == with_tools


def test_a_turn_is_decoded_with_its_special_tokens_and_without_its_turn_end():
    tok = qwen2_5_tokenizer()
    bridge = ChatBridge(tok)
    assert bridge.assistant_message([]) == {"role": "assistant", "content": ""}
    turn = tok.encode("a<|endoftext|>b", add_special_tokens=False)
    assert bridge.assistant_message(turn + list(bridge.turn_end_ids))["content"] == "a<|endoftext|>b"
    assert bridge.assistant_message(turn)["content"] == "a<|endoftext|>b"  # cut short: nothing to leave out
    assert not bridge.ends_turn([])


# A template whose tool messages show the calls they answer (id, name, arguments): what the
# bridge's stand-in assistant turn holds becomes visible in the environment ids.
SHOWS_CALLS = (
    "{% set ns = namespace(calls=[]) %}{% if greeting is defined %}<|im_start|>system\n{{ greeting }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'assistant' %}{% set ns.calls = m.tool_calls or [] %}{% endif %}"
    "<|im_start|>{{ m.role }}\n{% if m.role == 'tool' %}{% for c in ns.calls %}{{ c.id }} {{ c.function.name }} "
    "{{ c.function.arguments | tojson }};{% endfor %}{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def schema(name: str, types: dict) -> dict:
    return {"type": "function", "function": {"name": name, "description": name, "parameters": {
        "type": "object", "properties": {k: {"type": t} for k, t in types.items()}}}}


def test_the_stand_in_turn_calls_the_tool_each_result_names_with_probe_arguments():
    tok = qwen2_5_tokenizer()
    bridge = ChatBridge(tok, schemas=[schema("mul", {"i": "integer"}),
                                      schema("add", {"n": "number", "s": "string", "f": "boolean", "o": "object"})],
                        chat_template=SHOWS_CALLS)
    env = bridge.environment_ids([{"role": "tool", "name": "add", "tool_call_id": "c7", "content": "9"},
                                  {"role": "tool", "content": "5"}])
    # the first result names add and its call id; the second neither: the first tool, call00001
    calls = 'c7 add {"n": 7, "s": "7", "f": true, "o": null};call00001 mul {"i": 7};'
    assert tok.decode(env) == (f"\n<|im_start|>tool\n{calls}9<|im_end|>\n<|im_start|>tool\n{calls}5<|im_end|>\n"
                               "<|im_start|>assistant\n")
    # the turn they answer, when given, is used instead
    given = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "z", "type": "function", "function": {"name": "mul", "arguments": {"i": 3}}}]}
    assert tok.decode(bridge.environment_ids([{"role": "tool", "content": "5"}], assistant=given)) == \
        '\n<|im_start|>tool\nz mul {"i": 3};5<|im_end|>\n<|im_start|>assistant\n'
    # a user message answers no call
    assert tok.decode(bridge.environment_ids([{"role": "user", "content": "u"}])) == \
        "\n<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n"


def test_template_kwargs_reach_the_template():
    tok = qwen2_5_tokenizer()
    bridge = ChatBridge(tok, chat_template=SHOWS_CALLS, template_kwargs={"greeting": "hi"})
    assert tok.decode(bridge.prompt_ids([{"role": "user", "content": "q"}])) == \
        "<|im_start|>system\nhi<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"


def test_a_whole_token_that_is_not_special_is_not_the_turn_end():
    # Qwen's </tool_call> is one token but not a special one: the turn ends at the <|im_end|> after it
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}</tool_call><|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tok = qwen2_5_tokenizer()
    assert tok.convert_ids_to_tokens(list(ChatBridge(tok, chat_template=template).turn_end_ids)) == ["<|im_end|>"]


def test_a_template_whose_call_turns_have_no_turn_end_is_refused_when_a_tool_answers():
    # plain turns end with <|im_end|> (found there); a tool-calling turn renders none, so there is
    # no telling where the model's turn ends before a tool result
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and m.tool_calls %}"
                "{% for c in m.tool_calls %}{{ c.function.name }}{{ c.function.arguments | tojson }}{% endfor %}"
                "{% elif m.role == 'assistant' %}{{ m.content }}<|im_end|>{% else %}{{ m.content }}\n{% endif %}"
                "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tok = qwen2_5_tokenizer()
    bridge = ChatBridge(tok, [mul], chat_template=template)
    assert tok.convert_ids_to_tokens(list(bridge.turn_end_ids)) == ["<|im_end|>"]
    with pytest.raises(BridgeError) as e:
        bridge.environment_ids([{"role": "tool", "content": "6"}])
    assert str(e.value) == (f"the template rendered no turn-end token {list(bridge.turn_end_ids)} after the assistant "
                            "turn; cannot tell where the model's turn ends")


def test_what_a_template_writes_only_after_the_last_turn_does_not_break_the_prefix_rule():
    # <|endoftext|> after the conversation's last turn only: each turn up to its turn end is still a prefix
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>"
                "{% if loop.last and not add_generation_prompt %}<|endoftext|>{% endif %}\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    assert ChatBridge(qwen2_5_tokenizer(), chat_template=template).preserves_prefixes()


@pytest.mark.parametrize("template,message", [
    ("{% for m in messages %}<|im_start|>{{ m.role }}<|im_end|>{% endfor %}"
     "{% if add_generation_prompt %}<|im_start|>assistant{% endif %}",
     "could not find the token that ends an assistant turn in this template"),
    ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}",
     "no special token follows the content of an assistant turn in this template (it ends with '\\n'); the engine "
     "needs a turn-end token to stop on"),
    ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}"
     "{% if add_generation_prompt %}<|im_start|>model\n{% endif %}",
     "the generation prompt is not a prefix of the rendered assistant turn (token 8: 'model\\n' became "
     "'assistant\\n7<|im_end|>'); the model's turn cannot continue the prompt ids"),
])
def test_unusable_templates_are_refused_word_for_word(template, message):
    with pytest.raises(BridgeError) as e:
        ChatBridge(qwen2_5_tokenizer(), chat_template=template)
    assert str(e.value) == message


def test_the_small_helpers_on_hand_made_ids():
    from tokenflow.envs.bridge import _common_suffix, _first_difference, _last_index

    assert (_first_difference([1, 5], [1, 2]), _first_difference([1, 2], [1, 2, 3]), _first_difference([1, 2, 3], [1, 2])) \
        == (1, 2, 2)
    assert (_last_index([5, 2, 7, 2], (2,)), _last_index([2, 5], (2,)), _last_index([5, 3], (2,))) == (3, 0, None)
    assert _common_suffix([[1, 2, 3], [4, 2, 3]]) == [2, 3] and _common_suffix([[1, 2, 9], [4, 2, 3]]) == []
    assert _common_suffix([[1, 2], [1, 2]]) == [1, 2] and _common_suffix([[1, 2], [3, 2]]) == [2]
    assert _common_suffix([[9, 1, 2], [2]]) == [2]


def test_a_tokenizer_without_a_chat_template_is_refused_with_what_to_do():
    bare = qwen2_5_tokenizer.__wrapped__()
    bare.chat_template = None
    with pytest.raises(BridgeError) as e:
        ChatBridge(bare)
    assert str(e.value) == ("the tokenizer has no chat template; multi-turn rollouts render conversations through it "
                            "(set tokenizer.chat_template or pass chat_template=)")
