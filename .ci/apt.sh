#!/usr/bin/env bash
# Sourced by .ci/chromium.sh and .ci/postgres.sh: `apt_install CALLER PACKAGE` installs one Debian
# package quietly (with sudo when not root; the package lists are refreshed only when apt knows no
# candidate for it), saying on stderr which script installs what.

apt_install() {
    local caller="$1" package="$2" sudo=""
    echo "${caller}: installing Debian's ${package}" >&2
    if [[ "$(id -u)" != 0 ]]; then sudo="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-cache policy "${package}" | grep -q 'Candidate: [0-9]'; then
        ${sudo} apt-get update -qq
    fi
    ${sudo} apt-get install -y -qq --no-install-recommends "${package}" >/dev/null
}
