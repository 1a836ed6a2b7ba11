#!/usr/bin/env bash
# The checks only a GPU can run, as one script for a short lease of a CUDA machine:
#   1. `servecast profile` of real-size Llama-3.1-8B layers in bfloat16 (random weights): GEMMs up
#      to 2048 tokens, the int8 / int4 / fp8 weight-only kernels, attention to 4096-token contexts,
#      quantized-KV reads, whole 1- and 4-layer forwards -- recorded as the catalog's HARDWARE;
#   2. the engine's tests on CUDA (SERVECAST_TEST_DEVICE=cuda; tensor parallelism needs 2 GPUs);
#   3. bench/gpu_quant.py: the 8B engine's memory and decode tokens/s per quantization mode on the
#      GPU, beside the simulator's prediction from that profile;
#   4. `servecast validate` on the GPU: the real engine serving the 8B model against the simulator
#      with that profile.
# Every part has its own time limit and writes under $OUT (default gpu-out/), so a part that runs
# long or fails leaves the others' results. Missing Python packages travel as wheels in .whl/.
#   usage: bash bench/gpu_checks.sh [HARDWARE]      (HARDWARE: catalog id of this GPU, default h200)
set -u
HARDWARE=${1:-h200}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
MODEL=simulator/catalog/models/llama-3.1-8b.json
PROFILE=$OUT/$HARDWARE-llama-3.1-8b-bf16.jsonl
PROFILE_LIMIT=${PROFILE_LIMIT:-250}
TESTS_LIMIT=${TESTS_LIMIT:-100}
QUANT_LIMIT=${QUANT_LIMIT:-90}
VALIDATE_LIMIT=${VALIDATE_LIMIT:-130}

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__,
  torch.cuda.get_device_name(0))"; } 2>&1 | tee "$OUT/machine.txt"

echo "== 1. profile ($PROFILE_LIMIT s)"
start=$SECONDS
timeout "$PROFILE_LIMIT" python3 -m app.cli profile --model llama-3.1-8b --device cuda --dtype bfloat16 \
    --hardware "$HARDWARE" --max-batched-tokens 2048 --max-context 4096 --quant int8,int4,fp8 \
    --kv-quant int8,fp8 --out "$PROFILE" --json > "$OUT/profile.json" 2> "$OUT/profile.err"
echo "profile: exit $? after $((SECONDS - start)) s, $(wc -l < "$PROFILE") lines"; tail -3 "$OUT/profile.err"

echo "== 2. engine tests on CUDA ($TESTS_LIMIT s)"
start=$SECONDS
SERVECAST_TEST_DEVICE=cuda timeout "$TESTS_LIMIT" python3 -m pytest tests/engine \
    --ignore=tests/engine/test_tensor_parallel.py -q -rf -p no:cacheprovider > "$OUT/tests-cuda.log" 2>&1
echo "tests: exit $? after $((SECONDS - start)) s"; tail -15 "$OUT/tests-cuda.log"

echo "== 3. quantization modes on the GPU ($QUANT_LIMIT s)"
start=$SECONDS
timeout "$QUANT_LIMIT" python3 bench/gpu_quant.py --profile "$PROFILE" --hardware "$HARDWARE" \
    > "$OUT/quant.txt" 2> "$OUT/quant.err"
echo "quant: exit $? after $((SECONDS - start)) s"; cat "$OUT/quant.txt"; tail -5 "$OUT/quant.err"

echo "== 4. validate on the GPU ($VALIDATE_LIMIT s)"
start=$SECONDS
timeout "$VALIDATE_LIMIT" python3 -m app.cli validate --model "$MODEL" --device cuda --dtype bfloat16 \
    --profile "$PROFILE" --num-requests 64 --repeats 1 --calibration-requests 32 --threads 0 \
    --json > "$OUT/validate.json" 2> "$OUT/validate.err"
echo "validate: exit $? after $((SECONDS - start)) s"; cat "$OUT/validate.json"; tail -5 "$OUT/validate.err"
