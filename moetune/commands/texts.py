"""Help texts that the README states too: one source of truth for both.

`tests/test_readme.py` checks that README.md says what these constants say, so a
change here that the README does not follow (or the reverse) fails the tests.
Plain strings, no imports: every command module may use them at import time.
"""

from __future__ import annotations

# What share of the pruned grid the fast search times (`bench/replay_search.py`).
FAST_SEARCH_SHARE = "about 5-10 % of the grid"
SEARCH_HELP = (
    f"fast: times {FAST_SEARCH_SHARE}, within 2 % of the best (measured), and SGLang's "
    "up/down split from a few seeded timings per batch size; thorough: 3-4x the "
    "timings, a wider climb over the full grid, and the split searches each GEMM as widely "
    "as the whole call (to measure what fast leaves); exhaustive: every candidate."
)

# Where the GPU name in the file names comes from when --device-name is not given.
DEVICE_NAME_DEFAULT = (
    "the first visible GPU's name (nvidia-smi, the same string torch reports), "
    "spaces as underscores; without a GPU, NVIDIA_H200"
)
DEVICE_NAME_HELP = f"GPU name for the file names. Default: {DEVICE_NAME_DEFAULT}."

# What the roofline floor of `tune`'s summary is made of (moetune/roofline.py).
FLOOR_HELP = (
    "The summary's 'of roofline' is floor / time, at most 100 %: floor = max(bytes / read "
    "bandwidth, flops / matmul peak); read bandwidth: the GPU's HBM spec (a streaming-read "
    "kernel's measurement where no spec is known), peak by an 8192^3 matmul of the kernel's compute dtype "
    "(bf16; fp8 _scaled_mm for fp8_w8a8; int8 _int_mm for int8_w8a8). The bytes are the weights "
    "of the experts the timed routings hit: expected under uniform routing, or, with --routing "
    "PATH, counted on the dump windows the timings replay."
)
