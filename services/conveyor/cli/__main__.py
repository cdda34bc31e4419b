"""``python -m conveyor.cli``: the ``conveyor`` command."""

import sys

from .main import main

sys.exit(main())
