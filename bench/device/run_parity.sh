#!/usr/bin/env bash
# Logit parity of kvfleet against Hugging Face transformers on a machine with torch and
# transformers (no network needed). Builds nothing: point it at an existing kvfleet build.
#
#   bench/device/run_parity.sh [BIN_DIR] [OUT_DIR] [hf_parity.py options...]
#     BIN_DIR  directory holding the kvfleet executable   (default: build/bin)
#     OUT_DIR  where parity.json and parity.log go        (default: $OUT, else build/parity)
#   e.g. bench/device/run_parity.sh build/bin "$OUT" --kvfleet-args="--device cuda"
#        bench/device/run_parity.sh build/bin "$OUT" --only qwen2 --keep-models
#
# Environment: PYTHON (default python3) must import torch, transformers and numpy.
# Exit status is hf_parity.py's: 0 all float32 variants within 1e-4 relative, 1 a miss or an
# error, 2 kvfleet missing (reference checked only); 124 when the 175 s guard fires. A failure of the
# default-model check (hf_default_model.py, 60 s guard, writes default_model_parity.json) makes it 1.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin_dir="${1:-$root/build/bin}"
out_dir="${2:-${OUT:-$root/build/parity}}"
shift $(( $# < 2 ? $# : 2 ))
python="${PYTHON:-python3}"

mkdir -p "$out_dir"
bin_dir="$(cd "$bin_dir" 2>/dev/null && pwd || echo "$bin_dir")"
out_dir="$(cd "$out_dir" && pwd)"

# A binary built on another machine may lack shared libraries here: say so up front.
: > "$out_dir/parity.log"
if [[ -x "$bin_dir/kvfleet" ]] && command -v ldd > /dev/null; then
  missing="$(ldd "$bin_dir/kvfleet" 2>&1 | grep 'not found' || true)"
  if [[ -n "$missing" ]]; then
    printf 'WARNING: kvfleet lacks shared libraries on this machine:\n%s\n' "$missing" \
      | tee -a "$out_dir/parity.log"
  fi
fi

# The whole check must stay under 3 minutes; keep a margin for start-up.
set +e
timeout 175 "$python" "$here/hf_parity.py" --bin "$bin_dir" --out "$out_dir" "$@" 2>&1 \
  | tee -a "$out_dir/parity.log"
status=${PIPESTATUS[0]}
# Then the trained default model (models/kvfleet-default): tokenizer, logits, perplexity and greedy text
# against transformers. It only adds a failure; hf_parity.py's exit codes keep their meaning.
if [[ -f "$root/models/kvfleet-default/eval/reference.json" ]]; then
  timeout 60 "$python" "$here/hf_default_model.py" --bin "$bin_dir" --out "$out_dir" 2>&1 \
    | tee -a "$out_dir/parity.log"
  [[ ${PIPESTATUS[0]} -eq 0 || $status -ne 0 ]] || status=1
fi
set -e
exit "$status"
