"""The ``robust_auroc`` evaluator: its plugin (``plugin.py``) and what it alone uses."""
