"""What vLLM and SGLang do with a tuned fused-MoE config file, in pure Python.

`vllm` and `sglang` port each engine's lookup (which folders, in which order,
which row of the file) and its fallback config when no file is found; `install`
puts moetune's files where an engine reads them; `installed` finds an installed
engine and where its release keeps its files. Nothing here imports torch, triton
or the engines themselves: installed engines are found with
`importlib.util.find_spec`, the Triton version from package metadata.

The engines' own lookup functions are not called: their modules import torch
and triton (and vLLM's names the file after the GPU in this machine). The tests
under tests/engines_real run them from the released source, with those names
stubbed, and check that the port answers the same.
"""
