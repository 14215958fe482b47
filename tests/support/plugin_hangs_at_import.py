"""A plugin module whose import never finishes (a network mount that does not answer, say)."""

import time

time.sleep(3600)
