#!/usr/bin/env bash
# The two Quickstart commands:  ./dev.sh up   and   ./dev.sh test
# Both create .venv (once per pyproject change) and install skewd into it; nothing else is needed
# on a fresh machine with python3 >= 3.10.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
venv() {
  if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv; fi
  stamp=.venv/.skewd-installed
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ]; then
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null
    .venv/bin/python -m pip install -q -e '.[dev]'
    touch "$stamp"
  fi
}
cmd=${1:-}
shift || true
case "$cmd" in
  up)   venv; exec .venv/bin/skewd up "$@" ;;
  test) venv
        # the HTML report test renders in headless Chromium (Debian's package); as root, install it
        if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
          (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium) \
            >/dev/null 2>&1 || echo "dev.sh: could not install chromium; the report rendering test will skip" >&2
        fi
        # the Alertmanager sink test runs a real Alertmanager (Debian's package); as root, install it
        if ! command -v prometheus-alertmanager >/dev/null 2>&1 && ! command -v alertmanager >/dev/null 2>&1 \
           && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
          (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus-alertmanager) \
            >/dev/null 2>&1 || echo "dev.sh: could not install prometheus-alertmanager; the real-Alertmanager test will skip" >&2
        fi
        set +e; .venv/bin/python -m pytest "$@"; rc=$?; set -e
        # pytest exits 5 when it collected nothing: that is a failure of the suite, not a pass
        exit $rc ;;
  *) echo "usage: ./dev.sh up [skewd up options] | ./dev.sh test [pytest options]" >&2; exit 2 ;;
esac
