#!/usr/bin/env bash
# Installs everything dsrun/dstrain need to build and test, from Debian packages.
# Idempotent: packages already present are skipped by apt-get.
#   scripts/setup.sh          build + test dependencies
#   scripts/setup.sh --bench  also the peers used by bench/ (python3-torch, openmpi)
set -euo pipefail

pkgs=(
  # build
  build-essential cmake ninja-build pkg-config
  libcli11-dev nlohmann-json3-dev libfmt-dev catch2 libssh-dev
  libopenblas-dev libgloo-dev
  # tests with real components
  openssh-server openssh-client pdsh iproute2 numactl procps
  slurm-wlm munge
)
if [[ "${1:-}" == "--bench" ]]; then
  pkgs+=(python3-torch python3-numpy openmpi-bin hyperfine)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "setup: all dependencies present"
