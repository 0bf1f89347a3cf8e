"""The run: preflight checks, the pipeline and the OpenOOD export."""
