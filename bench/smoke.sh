#!/usr/bin/env bash
# Benchmark smoke run: every script in bench/ once in its --quick mode (the same code paths at tiny
# sizes), each one's output printed as it runs. Exits non-zero if any of them does. It times them
# but checks no figures or speeds: a benchmark passes by finishing and printing its table.
#   usage: bash bench/smoke.sh            (make bench-smoke)
# The scripts that read ../shared get it through --shared (SHARED=DIR to point elsewhere); where it
# is missing, those that cannot do without it are skipped, as the tests that need it are. Temporary files (throwaway models,
# profiles) go to a folder removed at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
if [ -x "$VENV/bin/python" ]; then
    export PATH="$PWD/$VENV/bin:$PATH"
fi
SHARED=${SHARED:-$(cd .. && pwd)/shared}
export PYTHONUNBUFFERED=1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export TMPDIR=$TMP

SCRIPTS=(linear_backends.py sim_speed.py plan_speed.py mlperf_check.py app_responsiveness.py cost_model_heldout.py vllm_runs.py closed_loop_check.py
         cross_device.py disaggregation.py serve_overhead.py serve_closed_loop.py engine_throughput.py tensor_parallel.py context_parallel.py spec_decode.py quant.py gpu_quant.py gpu_checks.sh
         gpu_kernels.py gpu_kernels_compare.py)
TAKES_SHARED=" sim_speed.py mlperf_check.py app_responsiveness.py cost_model_heldout.py vllm_runs.py "
NEEDS_SHARED=" sim_speed.py mlperf_check.py cost_model_heldout.py vllm_runs.py "
# A new benchmark must join the list (helpers are named _*.py).
for path in bench/*.py bench/*.sh; do
    name=$(basename "$path")
    if [[ "$name" != _* && "$name" != smoke.sh && " ${SCRIPTS[*]} " != *" $name "* ]]; then
        echo "bench/smoke.sh does not run bench/$name: add it to SCRIPTS (it needs a --quick mode)"
        exit 1
    fi
done

now_us() { echo "${EPOCHREALTIME//[.,]/}"; }
since() { local us=$(( $(now_us) - $1 )); printf '%d.%d' $((us / 1000000)) $((us % 1000000 / 100000)); }

failed=()
summary=()
started_all=$(now_us)
for script in "${SCRIPTS[@]}"; do
    args=(--quick)
    if [ ! -d "$SHARED" ] && [[ "$NEEDS_SHARED" == *" $script "* ]]; then
        echo "=== bench/$script: skipped ($SHARED is not there)"
        summary+=("$(printf '%-24s %8s  %s' "$script" "-" "skipped: no $SHARED")")
        continue
    fi
    if [ -d "$SHARED" ] && [[ "$TAKES_SHARED" == *" $script "* ]]; then
        args+=(--shared "$SHARED")
    fi
    echo
    echo "=== bench/$script ${args[*]}"
    started=$(now_us)
    if [[ "$script" == *.sh ]]; then
        OUT="$TMP/gpu-out" bash "bench/$script" "${args[@]}"
    else
        python "bench/$script" "${args[@]}"
    fi
    rc=$?
    seconds=$(since "$started")
    status=ok
    if [ "$rc" != 0 ]; then
        status="FAILED (exit $rc)"
        failed+=("$script")
    fi
    echo "=== bench/$script: $status after ${seconds} s"
    summary+=("$(printf '%-24s %8s  %s' "$script" "$seconds" "$status")")
done

echo
echo "benchmark smoke run (--quick), seconds of wall time:"
printf '  %s\n' "${summary[@]}"
printf '  %-24s %8s\n' "total" "$(since "$started_all")"
if [ "${#failed[@]}" != 0 ]; then
    echo "FAILED: ${failed[*]}"
    exit 1
fi
echo "all benchmarks ran"
