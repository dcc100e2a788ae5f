"""``python -m spool_reporter.collector serve|stats ...`` (the same as ``django-spool collector ...``)."""

from __future__ import annotations

import sys

from ._cli import main

if __name__ == "__main__":
    sys.exit(main())
