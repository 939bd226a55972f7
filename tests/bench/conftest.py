"""The bench scripts are scripts, not a package: their folder goes on sys.path (at the end, so
nothing installed is shadowed) and their tests import them by name."""

import sys
from pathlib import Path

BENCH = str(Path(__file__).resolve().parents[2] / "bench")
if BENCH not in sys.path:
    sys.path.append(BENCH)
