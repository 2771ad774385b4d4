"""``python -m pyflink_aisp.models [--cache-dir DIR]``: build the model assets."""

from pyflink_aisp.models._cli import build_main

raise SystemExit(build_main())
