"""``python -m lmsp.cli``: the ``lmsp`` command."""

import sys

from lmsp.cli import main

sys.exit(main())
