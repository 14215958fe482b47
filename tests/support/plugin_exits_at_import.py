"""A plugin module that calls sys.exit while it is imported."""

import sys

sys.exit(4)
