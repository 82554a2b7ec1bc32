#!/usr/bin/env bash
# Make sure Debian's chromium is installed for the dashboard's browser test
# (tests/bench/test_track_html.py loads bench/track.py's page headless and checks a screenshot).
set -euo pipefail
if ! command -v chromium >/dev/null; then
    echo "chromium.sh: installing Debian's chromium" >&2
    sudo=""
    if [[ "$(id -u)" != 0 ]]; then sudo="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-cache policy chromium | grep -q 'Candidate: [0-9]'; then
        ${sudo} apt-get update -qq
    fi
    ${sudo} apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
echo "chromium.sh: $(chromium --version 2>/dev/null || echo 'chromium (version unreadable)')"
