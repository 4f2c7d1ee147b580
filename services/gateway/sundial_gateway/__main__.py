"""``python -m sundial_gateway``: the same as ``sundial gateway``."""

import sys

from sundial_gateway.cli import main

sys.exit(main())
