"""The base of every typed settings object of a run (the config's sections, the data and model specs)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from advopenood.errors import choice_message  # noqa: F401  (its former home)


class StrictModel(BaseModel):
    """Strict (an unknown key is an error) and frozen (read by attribute, never changed)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
