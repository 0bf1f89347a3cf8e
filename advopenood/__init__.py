"""advopenood: do post-hoc OOD detectors still work when the input is adversarial?"""
from pathlib import Path

__version__ = (Path(__file__).parent / "VERSION").read_text().strip()
