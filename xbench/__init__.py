"""xbench: which framework trains fastest on my model, batch and hardware, and do more
devices help? Identical work through pluggable backends, measured one way, with statistics.

Importing xbench imports no ML framework; backends load theirs inside worker processes.
"""

__version__ = "0.1.0"
