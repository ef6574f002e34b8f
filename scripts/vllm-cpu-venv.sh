#!/usr/bin/env bash
# Build a CPU-only vLLM venv beside the checkout (default: .venv-vllm) in which skewd's
# stat-logger plugin runs against the real vLLM classes (tests/controller/test_vllm_plugin.py).
#
#   scripts/vllm-cpu-venv.sh [VENV_DIR]        # idempotent: a finished venv returns at once
#
# Why a separate venv: vLLM pins torch, transformers and friends (~3 GB); skewd's own venv must
# stay small. Why --no-deps: vLLM's declared requirements pull the CUDA stack; on a machine
# without a GPU the metrics modules (vllm.v1.metrics.*) import with the CPU torch wheel plus a
# handful of pure-Python packages (see ../shared/facts.md, "vLLM").
# Environment: PYTHON (interpreter to build the venv from, >= 3.10; default python3),
# SKEWD_VLLM_VERSION (pip specifier, default 0.33.*), SKEWD_TORCH_VERSION (default 2.13.0).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$here/.venv-vllm}"
PY="${PYTHON:-python3}"
VLLM_SPEC="${SKEWD_VLLM_VERSION:-0.33.*}"
TORCH_VERSION="${SKEWD_TORCH_VERSION:-2.13.0}"
# vLLM's metrics/logging modules import these at module level (found by importing them with
# --no-deps and adding what was missing); nats-py is what the plugin itself needs.
DEPS=(packaging cbor2 pyzmq transformers aiohttp openai-harmony openai pillow pybase64 uvloop
      xgrammar fastapi partial-json-parser llguidance prometheus_client msgspec
      pyyaml numpy psutil cloudpickle urllib3 requests cachetools py-cpuinfo "nats-py>=2.6")
stamp="$venv/.skewd-vllm-ready"
want="vllm=$VLLM_SPEC torch=$TORCH_VERSION deps=${DEPS[*]}"

check() {
  "$venv/bin/python" - <<'EOF'
import vllm, vllm.v1.metrics.loggers as L, vllm.v1.metrics.stats as S
assert hasattr(L, "StatLoggerBase") and hasattr(S, "SchedulerStats") and hasattr(S, "IterationStats")
import nats, skewd.controller.vllm_plugin  # noqa: F401
print("vllm", vllm.__version__)
EOF
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && check 2>/dev/null; then
  exit 0
fi
echo "building $venv ($want)" >&2
[ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
# the CPU build of torch (a local wheel on this kind of machine; '+cpu' keeps pip off the CUDA one)
"${pip[@]}" "torch==$TORCH_VERSION+cpu" || "${pip[@]}" "torch==$TORCH_VERSION"
"${pip[@]}" --no-deps "vllm==$VLLM_SPEC"
"${pip[@]}" "${DEPS[@]}"
# skewd itself, editable and without its own dependencies (the plugin needs only nats-py)
"${pip[@]}" --no-deps -e "$here"
check
echo "$want" > "$stamp"
