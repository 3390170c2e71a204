"""The shipped tiny models and how each is built: ``python -m tokenflow.shipped_models.<name>``
rebuilds one into ``src/tokenflow/assets/`` (`make_default_model`: the default character-level
Llama and its presets; `make_moe_model`: it upcycled into a 4-expert Mixtral; `make_tool_model`:
the calculator-calling tool model; `warm_start_args`: their shared options). ``model.path =
"default"`` and friends resolve to what these write (`tokenflow.model_store.paths`).

May import: anything below (a front end, layer 6); nothing below imports it.
"""
