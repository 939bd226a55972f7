"""Test-wide setup: Triton runs in its interpreter unless a GPU run asks otherwise.

TRITON_INTERPRET must be set before triton is imported, so it is set here, at
collection time. `make test-gpu` sets TRITON_INTERPRET=0 and MOETUNE_GPU_TESTS=1.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "0":
    del os.environ["TRITON_INTERPRET"]

# The width moetune wraps at comes from the terminal or $COLUMNS. pytest-xdist's workers
# inherit COLUMNS=80 from somewhere in their start-up, a plain run none: a test that wants a
# width sets $COLUMNS itself, so the suite reads the same under both.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)
