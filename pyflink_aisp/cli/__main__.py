"""``python -m pyflink_aisp.cli``: the ``aisp`` command (the container entry point uses it)."""

import sys

from pyflink_aisp.cli import main

sys.exit(main())
