"""``model``: the typed model section of a run (architecture, classes, input layout, normalisation, and a
checkpoint or a training recipe)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from advopenood.errors import UsageError
from advopenood.spec import StrictModel, choice_message


class TrainSpec(StrictModel):
    """``model.train``: train the architecture on the fit set on first use (cached by recipe and data)."""

    epochs: int = Field(30, ge=1)
    lr: float = Field(0.01, gt=0)
    batch: int = Field(64, ge=1)
    #: mixup's Beta parameter (Zhang et al. 2018); 0 trains without mixup
    mixup: float = Field(0.0, ge=0)


class ModelSpec(StrictModel):
    """``model``: architecture, classes, input layout, normalisation, and a checkpoint or a training recipe."""

    arch: str
    num_classes: int = Field(10, ge=2)
    in_channels: Literal[1, 3] = 3
    input_size: int = Field(32, ge=8)
    checkpoint: str | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[Annotated[float, Field(gt=0)], ...] | None = None
    train: TrainSpec | None = None

    @field_validator("arch")
    @classmethod
    def _known_arch(cls, value: str, info: ValidationInfo) -> str:
        if not (info.context or {}).get("plugins", True):  # a check before torch loads: the plan's full one names it
            return value
        from advopenood.models.backbones import TIMM_PREFIX, ZOO_PREFIX, check_timm_name
        from advopenood.models.classifier import ARCHS

        if value.startswith((TIMM_PREFIX, ZOO_PREFIX)):
            try:
                if value.startswith(TIMM_PREFIX):
                    check_timm_name(value[len(TIMM_PREFIX):])
                else:
                    from advopenood.models.robustbench import check_zoo_name

                    check_zoo_name(value[len(ZOO_PREFIX):])
            except UsageError as exc:
                raise ValueError(str(exc)) from None
            return value
        if value not in ARCHS:
            raise ValueError(choice_message("architecture", value, list(ARCHS) + [
                f"{TIMM_PREFIX}<name>", f"{ZOO_PREFIX}<dataset>/<threat>/<model_id>"]))
        return value

    @model_validator(mode="after")
    def _channels(self) -> "ModelSpec":
        for key in ("mean", "std"):
            value = getattr(self, key)
            if value is not None and len(value) != self.in_channels:
                raise ValueError(f"{key} has {len(value)} values but in_channels is {self.in_channels}")
        if self.arch.startswith("robustbench:"):
            from advopenood.models.robustbench import zoo_normalisation

            try:
                zoo_normalisation(self.mean, self.std, self.in_channels)
            except UsageError as exc:
                raise ValueError(str(exc)) from None
        return self


def as_model_spec(spec: ModelSpec | Mapping[str, Any]) -> ModelSpec:
    """A typed model section from a section or a plain mapping (validated the same way)."""
    return ModelSpec.model_validate(dict(spec)) if isinstance(spec, Mapping) else spec
