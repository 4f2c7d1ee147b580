"""``python -m sundial_worker --app module:worker``: the same as ``sundial worker``."""

import sys

from sundial_worker.cli import main

sys.exit(main())
