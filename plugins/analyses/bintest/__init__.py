"""The ``bintest`` analysis: its plugin (``plugin.py``) and what it alone uses."""
