#!/usr/bin/env bash
# Sets up and runs the whole test suite (unit + slow end-to-end), as CI does.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"

# The UI test drives Debian's Chromium (a test tool's own browser download cannot work offline).
if ! command -v chromium >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
    || echo "warning: could not install chromium; the UI test will be skipped" >&2
fi

PREFECT_HOME="$(mktemp -d)"
export PREFECT_HOME
trap 'rm -rf "$PREFECT_HOME"' EXIT
python -m pytest -q "$@"
