"""``python -m opmap.cli``: the same command line as the ``opmap`` script."""

import sys

from opmap.cli import main

sys.exit(main())
