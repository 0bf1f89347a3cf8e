"""Built-in detectors (filled by the detector backends)."""
