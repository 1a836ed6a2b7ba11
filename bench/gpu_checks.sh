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
#   usage: bash bench/gpu_checks.sh [--quick] [HARDWARE]   (HARDWARE: catalog id of this GPU, default h200)
# --quick: a smoke run of the same four parts at small sizes -- the bundled small Llama profiled on
# the tiny grid, one engine test file on CUDA, bench/gpu_quant.py --quick, a short validate -- each
# in a minute or less. Without CUDA it says so and exits 0.
set -u
QUICK=0
HARDWARE=h200
for arg in "$@"; do
    case "$arg" in
        --quick) QUICK=1 ;;
        *) HARDWARE=$arg ;;
    esac
done
OUT=${OUT:-gpu-out}
if [ "$QUICK" = 1 ] && ! python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "bench/gpu_checks.sh needs a CUDA GPU: torch under $(command -v python3) sees none, so nothing to run"
    exit 0
fi
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
PROFILE_ARGS=(--model llama-3.1-8b --max-batched-tokens 2048 --max-context 4096 --quant int8,int4,fp8 --kv-quant int8,fp8)
TESTS=(tests/engine --ignore=tests/engine/test_tensor_parallel.py)
QUANT_ARGS=(--profile "$PROFILE")
VALIDATE_ARGS=(--model "$MODEL" --num-requests 64 --repeats 1 --calibration-requests 32)
if [ "$QUICK" = 1 ]; then  # the bundled small Llama ('demo', validate's default model), tiny grids
    PROFILE=$OUT/$HARDWARE-demo-bf16-quick.jsonl
    PROFILE_LIMIT=${PROFILE_LIMIT_QUICK:-60}; TESTS_LIMIT=${TESTS_LIMIT_QUICK:-60}
    QUANT_LIMIT=${QUANT_LIMIT_QUICK:-60}; VALIDATE_LIMIT=${VALIDATE_LIMIT_QUICK:-60}
    PROFILE_ARGS=(--model demo --quick --quant int8 --kv-quant int8)
    TESTS=(tests/engine/test_engine_parity.py)
    QUANT_ARGS=(--quick)
    VALIDATE_ARGS=(--num-requests 8 --repeats 1 --calibration-requests 4)
fi

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__,
  torch.cuda.get_device_name(0))"; } 2>&1 | tee "$OUT/machine.txt"

echo "== 1. profile ($PROFILE_LIMIT s)"
start=$SECONDS
timeout "$PROFILE_LIMIT" python3 -m app.cli profile "${PROFILE_ARGS[@]}" --device cuda --dtype bfloat16 \
    --hardware "$HARDWARE" --out "$PROFILE" --json > "$OUT/profile.json" 2> "$OUT/profile.err"
echo "profile: exit $? after $((SECONDS - start)) s, $(wc -l < "$PROFILE") lines"; tail -3 "$OUT/profile.err"

echo "== 2. engine tests on CUDA ($TESTS_LIMIT s)"
start=$SECONDS
SERVECAST_TEST_DEVICE=cuda timeout "$TESTS_LIMIT" python3 -m pytest "${TESTS[@]}" \
    -q -rf -p no:cacheprovider > "$OUT/tests-cuda.log" 2>&1
echo "tests: exit $? after $((SECONDS - start)) s"; tail -15 "$OUT/tests-cuda.log"

echo "== 3. quantization modes on the GPU ($QUANT_LIMIT s)"
start=$SECONDS
timeout "$QUANT_LIMIT" python3 bench/gpu_quant.py "${QUANT_ARGS[@]}" --hardware "$HARDWARE" \
    > "$OUT/quant.txt" 2> "$OUT/quant.err"
echo "quant: exit $? after $((SECONDS - start)) s"; cat "$OUT/quant.txt"; tail -5 "$OUT/quant.err"

echo "== 4. validate on the GPU ($VALIDATE_LIMIT s)"
start=$SECONDS
timeout "$VALIDATE_LIMIT" python3 -m app.cli validate "${VALIDATE_ARGS[@]}" --device cuda --dtype bfloat16 \
    --profile "$PROFILE" --threads 0 --json > "$OUT/validate.json" 2> "$OUT/validate.err"
echo "validate: exit $? after $((SECONDS - start)) s"; cat "$OUT/validate.json"; tail -5 "$OUT/validate.err"
