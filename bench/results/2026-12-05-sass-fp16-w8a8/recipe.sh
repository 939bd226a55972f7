#!/bin/bash
# Run from the repository root (a checkout with the moetune venv active). SASS of the twin vs vLLM 0.34.0's fused_moe_kernel, fp16 checkpoint, w8a8 paths (sm_90a, CPU).
cd "$(git rev-parse --show-toplevel)"
export PYTHONPATH=$PWD
SITE=${SITE:-.engines/vllm-0.34.0+sglang-0.5.23}  # make fetch-engines
REF=$SITE/vllm/model_executor/layers/fused_moe/fused_moe.py
run() { python bench/sass_loop.py --vllm-ref $REF --vllm-release 0.34.0 --checkpoint fp16 --M 256 "$@" 2>&1 | grep -v -i warn; }
run --path fp8-tensor --configs 16/64/128/1/4/4,64/128/128/16/4/3
run --path fp8-channel --configs 8/64/128/16/4/5,64/128/128/16/4/3
run --path int8-channel --configs 16/64/128/1/4/4,64/128/128/16/4/3
run --path fp8-block --configs 16/256/128/1/4/3,64/256/128/16/4/3
run --down --path fp8-tensor --configs 64/128/128/16/4/3
run --down --path fp8-channel --configs 64/128/128/16/4/3
run --down --path int8-channel --configs 64/128/128/16/4/3
run --down --path fp8-block --configs 64/256/128/16/4/3
echo "== negative control: the twin computing in the output's dtype (fp16), as before"
python -c "
import sys; sys.argv[0] = 'bench/sass_loop.py'; sys.path.insert(0, 'bench')
import moetune.kernel.fused_moe_kernel as twin
from moetune.kernel.launch_rules import ComputeRule
twin.VLLM_COMPUTE = ComputeRule()
import sass_loop
sys.exit(sass_loop.main(['--vllm-ref', '$REF', '--vllm-release', '0.34.0', '--checkpoint', 'fp16', '--M', '256', '--path', 'fp8-tensor', '--configs', '64/128/128/16/4/3']))
" 2>&1 | grep -v -i warn
