#!/usr/bin/env bash
# Make sure Debian's chromium is installed for the dashboard's browser test
# (tests/bench/test_track_html.py loads bench/track.py's page headless and checks a screenshot).
set -euo pipefail
# shellcheck source=.ci/apt.sh
source "$(dirname "$0")/apt.sh"
if ! command -v chromium >/dev/null; then
    apt_install chromium.sh chromium
fi
echo "chromium.sh: $(chromium --version 2>/dev/null || echo 'chromium (version unreadable)')"
