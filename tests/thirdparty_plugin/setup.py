"""A third-party advopenood plugin: one detector, registered only through an entry point."""
from setuptools import setup

setup(
    name="advopenood-example-plugin",
    version="0.1.0",
    packages=["advopenood_example"],
    entry_points={"advopenood.detectors": ["negentropy = advopenood_example:NegEntropy"]},
)
