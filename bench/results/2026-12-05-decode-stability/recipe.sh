set -u
python3 -m pip install -q --no-index --find-links .whl --target /tmp/site jsonschema >/dev/null 2>&1 || echo "pip failed"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $OUT/machine.txt; date -u >> $OUT/machine.txt
python3 -c "import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__)" >> $OUT/machine.txt
timeout 200 python3 bench/decode_stability.py --out /tmp/bf16 --processes 5 --repeats 6 > $OUT/bf16.txt 2>&1; cp /tmp/bf16/decode_stability.jsonl $OUT/bf16.jsonl
timeout 200 python3 bench/decode_stability.py --out /tmp/fp8 --processes 5 --repeats 6 --shape 256,256,7168,8 --dtype fp8_w8a8 --block-shape 128,128 --config 16,128,128,1,4,3 > $OUT/fp8.txt 2>&1; cp /tmp/fp8/decode_stability.jsonl $OUT/fp8.jsonl
cat $OUT/bf16.txt $OUT/fp8.txt | tail -30
