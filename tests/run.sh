#!/usr/bin/env bash
# From a fresh checkout to a full test run: installs the dependencies, builds
# the preset (cpu by default) and runs every test with CTest.
#   PRESET=cpu     CMake preset (cpu or debug)
#   CTEST_ARGS=""  extra ctest arguments, e.g. "-L unit"
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${PRESET:-cpu}
bash .ci/deps.sh
cmake --preset "$PRESET" >/dev/null
cmake --build --preset "$PRESET"
# shellcheck disable=SC2086
ctest --preset "$PRESET" ${CTEST_ARGS:-}
