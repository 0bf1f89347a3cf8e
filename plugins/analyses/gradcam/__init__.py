"""The ``gradcam`` analysis: its plugin (``plugin.py``) and what it alone uses."""
