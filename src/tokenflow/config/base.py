"""Base class of every config section.

Each section is a pydantic model whose fields carry their documentation as attribute docstrings
(``use_attribute_docstrings``), so the help text lives in exactly one place: under the field.
Unknown keys are refused (``extra="forbid"``) and values are checked on assignment too. A float
field refuses NaN and ±inf (``allow_inf_nan=False``): ``--trainer.lr inf`` would otherwise train a
model of NaNs and exit 0.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigModel(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        use_attribute_docstrings=True,
        validate_assignment=True,
        validate_default=True,
        allow_inf_nan=False,
    )
