"""advopenood: do post-hoc OOD detectors still work when the input is adversarial?"""
from pathlib import Path

from advopenood import deprecated

__version__ = (Path(__file__).parent / "VERSION").read_text().strip()
deprecated.install()  # importing a module path that 0.3.0 removed fails in one line naming its new path
