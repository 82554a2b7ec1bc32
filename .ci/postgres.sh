#!/usr/bin/env bash
# Make sure Debian's PostgreSQL server is installed for the memory/ test suite.
#
# The tests start their own throwaway cluster (initdb + pg_ctl on a free loopback port, as the
# `postgres` OS user when run as root) and stop it at the end, so this script only installs the
# server binaries when they are missing and checks that they run. With --url it also starts a
# cluster under $A3R_PG_DIR (default /tmp/a3r-postgres) and prints its SQLAlchemy URL, for manual use.
set -euo pipefail
# shellcheck source=.ci/apt.sh
source "$(dirname "$0")/apt.sh"

bindir() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }

dir="$(bindir || true)"
if [[ -z "${dir}" || ! -x "${dir}/pg_ctl" || ! -x "${dir}/initdb" ]]; then
    apt_install postgres.sh postgresql
    dir="$(bindir)"
fi
echo "postgres.sh: $("${dir}/postgres" --version) in ${dir}"

if [[ "${1:-}" == "--url" ]]; then
    data="${A3R_PG_DIR:-/tmp/a3r-postgres}"
    port="${A3R_PG_PORT:-54329}"
    run=()
    if [[ "$(id -u)" == 0 ]]; then run=(runuser -u postgres --); fi
    if [[ ! -f "${data}/PG_VERSION" ]]; then
        mkdir -p "${data}"
        if [[ "$(id -u)" == 0 ]]; then chown postgres: "${data}"; fi
        "${run[@]}" "${dir}/initdb" -D "${data}" -U postgres --auth=trust -E UTF8 >/dev/null
    fi
    if ! "${run[@]}" "${dir}/pg_ctl" -D "${data}" status >/dev/null 2>&1; then
        "${run[@]}" "${dir}/pg_ctl" -D "${data}" -l "${data}/server.log" -w \
            -o "-p ${port} -k ${data} -c listen_addresses=127.0.0.1" start >/dev/null
    fi
    echo "postgresql+psycopg://postgres@127.0.0.1:${port}/postgres"
fi
