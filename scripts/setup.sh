#!/usr/bin/env bash
# Installs troupe's build dependencies from Debian's packages. Idempotent: a
# package already installed is not touched, and nothing is fetched from
# anywhere but the Debian archive. Run as root (or with sudo).
set -euo pipefail

packages=(
  # toolchain
  gcc g++ cmake ninja-build pkg-config
  # chosen dependencies (see DEVELOPERS.md): CAF (in-process actors), UCX,
  # Cap'n Proto, Catch2 v2, fmt, plus spdlog for logs
  libcaf-dev libucx-dev ucx-utils capnproto libcapnp-dev catch2 libfmt-dev libspdlog-dev
  # the cluster: the head's durable state, the command line, its JSON output
  libsqlite3-dev libcli11-dev nlohmann-json3-dev
  # tests: two hosts on one machine (network namespaces), process checks
  iproute2 procps
  # the RL stack: the policy model's CPU matrix products, job configs, the
  # interpreter the code-execution reward runs in its sandbox
  libopenblas-dev libtomlplusplus-dev python3-minimal
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#packages[@]} packages already installed"
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "setup: need root to install: ${missing[*]} (run: sudo bash scripts/setup.sh)" >&2
  exit 1
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
