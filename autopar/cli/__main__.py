"""``python -m autopar.cli``: the same as the ``autopar`` command."""

import sys

from . import main

sys.exit(main())
