"""What vLLM and SGLang do with a tuned fused-MoE config file, in pure Python.

`vllm` and `sglang` port each engine's lookup (which folders, in which order,
which row of the file) and its fallback config when no file is found; `install`
puts moetune's files where an engine reads them; `installed` finds an installed
engine and where its release keeps its files. Nothing here imports torch, triton
or the engines themselves: installed engines are found with
`importlib.util.find_spec`, the Triton version from package metadata.
"""
