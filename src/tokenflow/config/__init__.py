"""Typed configuration: every config section, TOML loading, presets, dotted command-line overrides.

The rule: every typed config section lives here, in the module named after the key a user
writes, so ``[trainer] lr`` is in ``config/trainer.py``. Keys read together share their group's
module::

    run.py        [run] [model] [metrics]     engine.py     [engine]
    task.py       [task] [episode]            algorithm.py  [algorithm]
    scorer.py     [scorer] (.teacher, .prm)   trainer.py    [trainer]
    rollout.py    [rollout] [sampling]        sync.py       [sync]
    runtime.py    [runtime]                   serve.py      [serve] (``tokenflow serve``)
    sim.py        [hardware] [workload] [pipeline] [sim] (``tokenflow simulate``)

``root.py`` is the whole training tree (``TrainConfig``) and the checks that span sections;
``base.py`` the base class of every section; ``loading.py`` and ``presets.py`` read TOML files,
presets and overrides.

Layer 1 (records and wiring).
May import: only ``tokenflow.config.*``, ``tokenflow.registry``, ``tokenflow.errors``,
``tokenflow._lazy``, ``tokenflow.engine.backends`` (the table of engine backends and what each
supports: a layer-1 record that imports only the registry, read lazily by the engine checks), the
standard library, pydantic and tomli_w. A check that needs a higher layer asks the registry
(lazily) or lives with the code that uses the section.
"""
