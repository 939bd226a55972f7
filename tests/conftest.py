"""Test-wide setup: Triton runs in its interpreter unless a GPU run asks otherwise.

TRITON_INTERPRET must be set before triton is imported, so it is set here, at
collection time. `make test-gpu` sets TRITON_INTERPRET=0 and MOETUNE_GPU_TESTS=1.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "0":
    del os.environ["TRITON_INTERPRET"]
