"""What evaluators and analyses read: the run context, OOD metrics, and re-derivation of a run's tables."""
