"""Detectors: the shared network pass, the fit pass, the detector bank, OpenOOD's postprocessors and the score store."""
