"""``python -m advopenood.cli``: the ``advopenood`` command."""
import sys

from advopenood.cli.main import main

sys.exit(main())
