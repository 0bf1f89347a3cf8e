"""The typed data entries of a run (``data.id``, ``data.fit``, ``data.ood[i]``): one class per dataset kind."""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import Field, TypeAdapter

from advopenood.spec import StrictModel


class _DataSpec(StrictModel):
    name: str | None = None
    #: OpenOOD's group of a natural set (near-OOD, far-OOD, covariate-shifted ID); default: by name for data.dataset
    group: Literal["near", "far", "csid", "other"] | None = None


class NpzSpec(_DataSpec):
    """An ``.npz`` file holding ``x`` (uint8, NHWC or NHW) and ``y`` (int labels)."""

    kind: Literal["npz"]
    path: str
    #: resize the shorter side to ``pre_size``, then centre-crop to the input size (as OpenOOD's test
    #: preprocessing); unset: the whole image is resized to the input size
    pre_size: int | None = Field(None, ge=8)


class IdxSpec(_DataSpec):
    """MNIST-style IDX image and label files."""

    kind: Literal["idx"]
    images: str
    labels: str


class OpenOODSpec(_DataSpec):
    """An OpenOOD image list under the data root (``benchmark_imglist/...``) and its image folder."""

    kind: Literal["openood"]
    imglist: str
    images: str = "images_classic"
    #: OpenOOD's test preprocessing: resize the shorter side to ``pre_size``, centre-crop to the input size
    pre_size: int | None = Field(None, ge=8)


class TorchvisionSpec(_DataSpec):
    """A torchvision dataset by name, read from the data root."""

    kind: Literal["torchvision"]
    dataset: str | None = None
    split: str | None = None
    download: bool = False


class DemoSpec(_DataSpec):
    """A data set embedded in the installed packages (the demo's)."""

    kind: Literal["demo"]
    split: Literal["train", "test"] = "test"
    name_as: str | None = None


DataSpec = Annotated[Union[NpzSpec, IdxSpec, OpenOODSpec, TorchvisionSpec, DemoSpec], Field(discriminator="kind")]
#: an image-list label: ASCII digits with an optional minus (``'²'.isdigit()`` is True, ``'--3'`` no integer)
INTEGER_LABEL = re.compile(r"-?[0-9]+")
DATA_KINDS = ("npz", "idx", "openood", "torchvision", "demo")


def as_data_spec(spec: DataSpec | Mapping[str, Any]) -> DataSpec:
    """A typed data entry from an entry or a plain mapping (``{"kind": "npz", "path": ...}``), validated."""
    if isinstance(spec, Mapping):
        return TypeAdapter(DataSpec).validate_python(dict(spec))
    return spec
