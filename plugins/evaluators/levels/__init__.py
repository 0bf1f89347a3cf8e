"""The ``levels`` evaluator: its plugin (``plugin.py``) and what it alone uses."""
