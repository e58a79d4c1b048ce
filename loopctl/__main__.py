"""``python -m loopctl``: the same as the ``loopctl`` command."""

from __future__ import annotations

import sys

from loopctl.demo.cli import main

if __name__ == "__main__":
    sys.exit(main())
