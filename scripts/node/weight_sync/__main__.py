"""``python -m scripts.node.weight_sync ...`` (a checkout or the installed package). The zipapp shipped
to nodes has its own top-level ``__main__.py`` (``components/sync_artifact.py`` writes it)."""
from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
