#!/usr/bin/env bash
# The CUDA backend's proof on the GPU machine, as one device call of about 8 minutes:
#
#   bench/device/run_cuda_checks.sh BUILD_DIR [OUT_DIR] [--dry-run]
#
# BUILD_DIR  a build with -DKVFLEET_CUDA=ON (portable: -DKVFLEET_PORTABLE=ON, tests on) holding
#            bin/test_cuda, bin/kvfleet and bin/kvfleet_cuda_bench
# OUT_DIR    default $OUT, else BUILD_DIR/cuda-checks
# --dry-run  print what would run and check that the pieces exist; run nothing heavy
#
# Steps, each under its own time limit:
#   1. the GPU, the cuBLAS library the binaries need (found and put on LD_LIBRARY_PATH), ldd     ~5 s
#   2. test_cuda with KVFLEET_REQUIRE_GPU=1 (a skip for want of a GPU is then a failure)      <=150 s
#   3. transformers parity of `kvfleet logits --backend cuda` (fp32 and bf16 random models),
#      and greedy choices against `--backend cpu` with near-ties counted                         <=175 s
#   4. kvfleet_cuda_bench: Llama-3.2-1B-shaped random bf16 model, decode tok/s at batch 1/32/128,
#      prefill tok/s at 512, in the batch-invariant and the cuBLAS GEMM modes                    <=200 s
# Files under OUT_DIR (at most 8, two levels): summary.txt, env.txt, test_cuda.log,
# parity/parity.json, parity/parity.log, cuda_bench.json, cuda_bench.log.
# Environment: PYTHON (python3) with torch + transformers; KVFLEET_CHECK_BACKEND=cpu runs steps 2-4
# against the CPU backend with a tiny model (to try the script on a machine without a GPU).
# Exit status: 0 when steps 2-4 all passed, else 1.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="${1:?usage: run_cuda_checks.sh BUILD_DIR [OUT_DIR] [--dry-run]}"
out="${2:-${OUT:-$build/cuda-checks}}"
dry=0
for a in "$@"; do [[ "$a" == "--dry-run" ]] && dry=1; done
[[ "$out" == "--dry-run" ]] && out="${OUT:-$build/cuda-checks}"
backend="${KVFLEET_CHECK_BACKEND:-cuda}"
bin="$(cd "$build/bin" 2>/dev/null && pwd || echo "$build/bin")"
mkdir -p "$out/parity"
out="$(cd "$out" && pwd)"
summary="$out/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
run() {  # run NAME LIMIT_S LOG CMD...: runs CMD under a time limit, logs it, notes PASS/FAIL
  local name="$1" limit="$2" log="$3"
  shift 3
  if (( dry )); then note "DRY  $name: timeout $limit $*"; return 0; fi
  local t0=$SECONDS
  timeout "$limit" "$@" > "$log" 2>&1
  local rc=$?
  note "$( ((rc == 0)) && echo PASS || echo "FAIL (exit $rc$( ((rc == 124)) && echo ", timed out"))") $name ($((SECONDS - t0)) s)"
  return $rc
}

# 1. The machine and the libraries.
{
  date -u
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  else
    echo "nvidia-smi: not available"
  fi
  command -v nvcc > /dev/null && nvcc --version | tail -1
} > "$out/env.txt" 2>&1
# cuBLAS is linked dynamically (static cuBLAS would not fit the 64 MiB carry): find libcublas.so.13 in
# the CUDA toolkit or in the pip wheels beside torch.
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
  $("${PYTHON:-python3}" -c 'import nvidia.cublas, os; print(os.path.join(nvidia.cublas.__path__[0], "lib"))' 2>/dev/null); do
  if ls "$d"/libcublas.so.* > /dev/null 2>&1; then export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
done
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}" >> "$out/env.txt"
status=0
for exe in test_cuda kvfleet kvfleet_cuda_bench; do
  if [[ ! -x "$bin/$exe" ]]; then note "MISSING $bin/$exe"; status=1; continue; fi
  missing="$(ldd "$bin/$exe" 2>&1 | grep 'not found' || true)"
  [[ -n "$missing" ]] && note "WARNING $exe lacks libraries: $missing"
done
cat "$out/env.txt"

# 2. Every kernel against its CPU reference, ModelRunner against the CPU backend, engine equivalence.
require=(env KVFLEET_REQUIRE_GPU=1)
[[ "$backend" == cpu ]] && require=(env)
run "test_cuda (kernels vs CPU, runner vs CPU, engine equivalence)" 150 "$out/test_cuda.log" \
  "${require[@]}" "$bin/test_cuda" || status=1
(( dry )) || grep -E "^\[doctest\] (test cases|assertions)|max\|diff\||near-tie" "$out/test_cuda.log" | tee -a "$summary"

# 3. Logits against transformers; greedy choices against the CPU backend.
run "transformers parity (--backend $backend), greedy vs --backend cpu" 185 "$out/parity/parity.log.run" \
  "$here/run_parity.sh" "$bin" "$out/parity" --kvfleet-args="--backend $backend" --compare-backend cpu || status=1
if (( ! dry )); then
  rm -f "$out/parity/parity.log.run"  # run_parity.sh keeps its own parity.log
  grep -E "^(variant|llama|qwen|mistral)|greedy|ratio =" "$out/parity/parity.log" | tee -a "$summary"
fi

# 4. First throughput numbers.
bench_args=(--model-dir /tmp/kvfleet-llama-1b --out "$out/cuda_bench.json")
[[ "$backend" == cpu ]] && bench_args+=(--backend cpu --small --batches 1,4 --prefill 64 --steps 4 --context 32)
run "kvfleet_cuda_bench (Llama-3.2-1B shape, bf16)" 200 "$out/cuda_bench.log" \
  "$bin/kvfleet_cuda_bench" "${bench_args[@]}" || status=1
(( dry )) || sed -n '/^mode /,$p' "$out/cuda_bench.log" | tee -a "$summary"

note "run_cuda_checks: $( ((status == 0)) && echo ALL PASSED || echo FAILURES) (backend $backend)"
exit $status
