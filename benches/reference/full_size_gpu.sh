#!/usr/bin/env bash
# The real-size measurement on one CUDA GPU: `examples/full_size` (built with `--features
# cuda`) and `benches/reference/full_size_torch.py` run one after the other on the same
# shapes, while the device memory in use is sampled every 50 ms (NVML) into OUT/memory.tsv.
# Every measurement's JSON line goes to OUT/results.jsonl, every process's stderr to
# OUT/log.txt; `benches/reference/full_size_report.py OUT` prints the table.
#
#   benches/reference/full_size_gpu.sh OUT [path of the full_size binary]
#
# Each step has its own time limit, so one that fails or runs long does not take the rest.
# bf16 is checked first on the small configuration; if it fails there, the real-size
# transformer runs in f32 instead (81.7 GB of weights, which still fit one H200).
set -u
out=${1:?usage: full_size_gpu.sh OUT [full_size binary]}
bin=${2:-target/release/examples/full_size}
mkdir -p "$out"
log="$out/log.txt"
results="$out/results.jsonl"

# NVRTC for burn's CUDA backend: the toolkit's or the one of the Python environment.
for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cuda_nvrtc", "lib") for p in nvidia.__path__))' 2>/dev/null); do
    if ls "$d"/libnvrtc.so* >/dev/null 2>&1; then
        export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        break
    fi
done
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c 'import torch, diffusers, peft, transformers; print("torch", torch.__version__, "diffusers", diffusers.__version__, "peft", peft.__version__, "transformers", transformers.__version__)'
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
} >>"$log" 2>&1

python3 - "$out/memory.tsv" <<'PY' &
import sys, time
import pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
with open(sys.argv[1], "w", buffering=1) as f:
    while True:
        used = pynvml.nvmlDeviceGetMemoryInfo(h).used
        f.write(f"{int(time.time() * 1000)}\t{used // 2**20}\n")
        time.sleep(0.05)
PY
sampler=$!

step() {
    local name=$1 limit=$2
    shift 2
    echo "== $name: $*" >>"$log"
    local t0=$SECONDS
    timeout "$limit" "$@" >>"$results" 2>>"$log"
    local rc=$?
    echo "== $name: rc $rc after $((SECONDS - t0)) s" >>"$log"
    return $rc
}

dtype=bf16
if ! step mid_bf16 "${MID_LIMIT:-45}" "$bin" --backend cuda --size mid --dtype bf16 --resolutions 256 --iters 2; then
    # ON_BF16_FAILURE=stop ends the run here instead.
    [ "${ON_BF16_FAILURE:-f32}" = stop ] && { kill $sampler; exit 0; }
    dtype=f32
fi
step rust_transformer "${RUST_LIMIT:-270}" "$bin" --backend cuda --part transformer --dtype $dtype
step torch_transformer "${TORCH_LIMIT:-150}" python3 benches/reference/full_size_torch.py --part transformer --dtype $dtype
step rust_text_encoder "${TEXT_LIMIT:-70}" "$bin" --backend cuda --part text-encoder --dtype $dtype
step torch_text_encoder "${TEXT_LIMIT:-70}" python3 benches/reference/full_size_torch.py --part text-encoder --dtype $dtype
kill $sampler
wait 2>/dev/null
exit 0
