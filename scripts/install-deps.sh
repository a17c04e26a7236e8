#!/usr/bin/env bash
# install-deps.sh - install the Debian packages oversub needs to build, test and benchmark.
# Idempotent: installs only what is missing; runs `apt-get update` once, only when needed.
# Usage: scripts/install-deps.sh [build|test|bench|all]   (default: test)
set -euo pipefail

want=${1:-test}
build_pkgs=(build-essential cmake pkg-config libevent-dev libjansson-dev libsqlite3-dev
            libyaml-dev libcmocka-dev sqlite3 libcurl4-openssl-dev
            libnghttp2-dev)
test_pkgs=(valgrind prometheus wrk nginx-light libxml2-utils curl procps python3 faketime
           clang python3-h11 chromium python3-jsonschema python3-yaml man-db groff-base
           python3-grpcio python3-grpc-tools python3-protobuf python3-pip)
bench_pkgs=(valgrind wrk nginx-light haproxy)

case "$want" in
    build) pkgs=("${build_pkgs[@]}") ;;
    test) pkgs=("${build_pkgs[@]}" "${test_pkgs[@]}") ;;
    bench) pkgs=("${build_pkgs[@]}" "${bench_pkgs[@]}") ;;
    all) pkgs=("${build_pkgs[@]}" "${test_pkgs[@]}" "${bench_pkgs[@]}") ;;
    *) echo "install-deps.sh: unknown set '$want' (build, test, bench or all)" >&2; exit 2 ;;
esac

# the OpenAI Node SDK for the gateway's tests: Node from Debian unless one is there already
if [ "$want" = test ] || [ "$want" = all ]; then
    command -v npm >/dev/null 2>&1 || pkgs+=(nodejs npm)
fi

missing=()
for p in "${pkgs[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done
sdk_install() { # tests/sdk's exact versions (package-lock.json): the OpenAI Node SDK and
    # puppeteer-core (drives the system chromium for test_dashboard.sh), once each
    local sdk
    sdk=$(cd "$(dirname "$0")/.." && pwd)/tests/sdk
    if { [ "$want" = test ] || [ "$want" = all ]; } &&
        { [ ! -d "$sdk/node_modules/openai" ] || [ ! -d "$sdk/node_modules/puppeteer-core" ]; }; then
        echo "install-deps.sh: npm ci in tests/sdk (the OpenAI Node SDK, puppeteer-core)" >&2
        (cd "$sdk" && PUPPETEER_SKIP_DOWNLOAD=1 npm ci --no-audit --no-fund >/dev/null)
    fi
}
if [ ${#missing[@]} -eq 0 ]; then
    sdk_install
    exit 0
fi
echo "install-deps.sh: installing ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo=sudo; else
        echo "install-deps.sh: need root (or sudo) to install: ${missing[*]}" >&2; exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
sdk_install
