"""A third-party advopenood plugin: a detector of each kind of interface, an attack, an evaluator and an analysis,
each registered only through an entry point (nothing here is imported by advopenood itself)."""
from setuptools import setup

setup(
    name="advopenood-example-plugin",
    version="0.2.0",
    packages=["advopenood_example"],
    install_requires=["advopenood"],
    entry_points={
        "advopenood.detectors": ["negentropy = advopenood_example:NegEntropy",
                                 "topgap = advopenood_example.detectors:TopGap"],
        "advopenood.attacks": ["randsign = advopenood_example.attacks:RandomSign"],
        "advopenood.evaluators": ["meanconf = advopenood_example.evaluators:MeanConfidence"],
        "advopenood.analyses": ["pertnorm = advopenood_example.analyses:PerturbationSize"],
    },
)
