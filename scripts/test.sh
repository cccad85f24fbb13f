#!/usr/bin/env bash
# Install everything the test suite needs on a fresh Debian machine, then run it.
#   bash scripts/test.sh            # CI selection (everything not marked slow)
#   bash scripts/test.sh -m ""      # everything, including slow synthesis/cosim runs
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v iverilog >/dev/null 2>&1; then
    echo "== installing Icarus Verilog (apt-get)"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq iverilog >/dev/null
fi

echo "== installing dnnfab with test extras (pip)"
python3 -m pip install -q --disable-pip-version-check -e '.[test]'

echo "== running tests"
args=("$@")
if [ ${#args[@]} -eq 0 ]; then
    args=(-m "not slow")
fi
set +e
python3 -m pytest -n 2 --dist loadgroup "${args[@]}"
rc=$?
set -e
if [ $rc -eq 5 ]; then
    echo "pytest collected no tests (exit 5)"; exit 1
fi
exit $rc
