"""The ``advopenood`` command line (:mod:`advopenood.cli.main`); importing it does not import torch."""
from advopenood.cli.main import main

__all__ = ["main"]
