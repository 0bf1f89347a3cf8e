"""advopenood: do post-hoc OOD detectors still work when the input is adversarial?"""
from pathlib import Path

from advopenood import deprecated

__version__ = (Path(__file__).parent / "VERSION").read_text().strip()
deprecated.install()  # the module paths of earlier versions import, with a DeprecationWarning
