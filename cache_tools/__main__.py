"""`python -m cache_tools ...` is the same as `kernelgen ...`."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":  # guarded: spawn-started prewarm workers import this module
    sys.exit(main())
