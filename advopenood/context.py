"""What a run hands to evaluator and analysis plugins, where they import it from (``from advopenood.context import
RunContext``); defined in :mod:`advopenood.evaluation.context`."""
from advopenood.evaluation.context import CleanRecord, RunContext

__all__ = ["CleanRecord", "RunContext"]
