#!/usr/bin/env bash
# Profiles two small LLMs (the GPU kit's pair, Qwen2.5-1.5B and Qwen2.5-0.5B, random weights)
# with the torch backend on the first CUDA device: each alone at GPU shares 1 and 0.5 (an MPS
# active-thread percentage), then both at once at 0.5 each (MPS co-location), then Llama-3-8B
# alone at share 1. Every run writes a measurement store under OUT; fit and compare them with
# benchmarks/gpu_mps_compare.py.
#
#   bash benchmarks/gpu_mps_profile.sh OUT [BUDGET_S]
#
# Needs torch with CUDA and transformers; the MPS steps need nvidia-cuda-mps-control (started
# here with its pipes under OUT/mps when none runs, and told to quit at the end). A step that
# fails is logged and the next one runs. SCEPSY_GPU_CHECK_DEVICE=cpu runs the same steps on
# the CPU at 1/16 scale (a smoke test of the commands; shares there are thread counts).
# STEPS (default "alone pair big") picks the steps: alone (each model alone at shares 1 and 0.5),
# pair (both at 0.5 at once), big (Llama-3-8B at share 1).
set -u
steps=" ${STEPS:-alone pair big} "
want() { case $steps in *" $1 "*) return 0 ;; esac; return 1; }
out=${1:?usage: gpu_mps_profile.sh OUT [BUDGET_S]}
budget=${2:-50}
device=${SCEPSY_GPU_CHECK_DEVICE:-cuda}
py=${PYTHON:-python3}
mkdir -p "$out"
log() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$out/steps.log" >&2; }
scale=1
big=llama-3-8b
if [ "$device" = cpu ]; then scale=0.0625; fi

profile() {  # NAME MODEL SHARE [extra args]
  local name=$1 model=$2 share=$3
  shift 3
  log "start $name ($model at share $share)"
  timeout $((budget + 120)) "$py" -c 'from scepsy.cli import main; main()' profile run \
    --backend torch --model "$model" --scale "$scale" --shares "$share" \
    --max-batch 32 --max-tokens 1024 --budget-s "$budget" --repeats 5 --warmup 2 \
    --engine-option device="$device" --quiet --out "$out/$name.jsonl" "$@" \
    >"$out/$name.out" 2>"$out/$name.err"
  log "end $name rc=$?"
}

{
  nvidia-smi -L || true
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_mode --format=csv || true
  "$py" -c 'import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__, torch.cuda.is_available())'
  command -v nvidia-cuda-mps-control || echo "no nvidia-cuda-mps-control"
} >"$out/env.txt" 2>&1

if want alone; then
  profile gen-1.0 qwen2.5-1.5b 1.0
  profile prm-1.0 qwen2.5-0.5b 1.0
fi

mps_started=0
if [ "$device" = cuda ]; then
  if command -v nvidia-cuda-mps-control >/dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY="$out/mps/pipe" CUDA_MPS_LOG_DIRECTORY="$out/mps/log"
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d; then mps_started=1; log "MPS daemon started"; else log "MPS daemon failed to start"; fi
    sleep 2
  else
    log "no MPS: the share-0.5 steps will be refused by the backend"
  fi
fi

if want alone; then
  profile gen-0.5 qwen2.5-1.5b 0.5
  profile prm-0.5 qwen2.5-0.5b 0.5
fi
if want pair; then
  log "start pair (both at share 0.5 at once)"
  profile pair-gen-0.5 qwen2.5-1.5b 0.5 &
  g=$!
  profile pair-prm-0.5 qwen2.5-0.5b 0.5 &
  p=$!
  wait $g $p
  log "end pair"
fi

if [ "$mps_started" = 1 ]; then echo quit | nvidia-cuda-mps-control; log "MPS daemon told to quit"; sleep 1; fi
if want big; then profile big-1.0 "$big" 1.0; fi
log "done"
