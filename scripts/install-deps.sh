#!/usr/bin/env bash
# Installs every Debian package SlurmForge needs to build, test and run its demo; with --browser also what
# the browser tests need (headless Chromium driven by Selenium; scripts/test.sh asks for it).
# Idempotent: when every package is already installed it returns at once without touching apt.
set -euo pipefail

packages=(
  # --- toolchain and build
  build-essential cmake ninja-build pkg-config git clang-format
  ccache                              # the compiler cache every preset builds through (cmake/ForgeCcache.cmake)
  # --- libraries the C++ code links against
  libopenmpi-dev openmpi-bin          # MPI (Open MPI 4.1, built with Slurm + PMIx support)
  libhdf5-dev hdf5-tools              # token shards and checkpoints; h5dump for tests
  libboost-program-options-dev        # job specs and CLI options
  catch2                              # unit tests (Catch2 v2 single header)
  libopenblas-dev                     # sgemm for the CPU kernels
  libsentencepiece-dev sentencepiece  # tokenizer training and encoding
  libxxhash-dev libssl-dev            # xxh3 and SHA-256
  nlohmann-json3-dev                  # manifests, metrics, reports
  libsqlite3-dev sqlite3              # the quota ledger
  libfmt-dev libspdlog-dev            # logging
  libhyperscan-dev                    # multi-pattern matching: PII and safety stages of prepare (x86-64)
  libcld2-dev                         # language identification in prepare (Compact Language Detector 2)
  libpcre2-dev                        # Hugging Face tokenizers' pre-tokenizer patterns (Unicode classes, JIT)
  libicu-dev                          # Hugging Face tokenizers' NFC/NFKC normalizers (ICU's Normalizer2)
  libpng-dev libjpeg62-turbo-dev      # decoding the images of image-text datasets (libpng, libjpeg-turbo)
  # --- the embedded dev cluster (scripts/devcluster)
  slurm-wlm slurmctld slurmd slurmdbd slurm-client libslurm-dev slurm-wlm-basic-plugins
  slurm-wlm-mysql-plugin munge mariadb-server libpmix-dev libpmix-bin
  # --- tools the scripts and tests call
  util-linux procps iproute2 python3
  python3-h5py                        # forge-ckpt export's interoperability check reads the file with h5py
  python3-regex python3-jinja2        # the tokenizer and chat-template references of the dataio tests
  python3-torch                       # the PyTorch references the Hugging Face import/export tests run
  python3-pil python3-numpy           # the image reference of the dataio tests (PIL's decoders and resize)
  bubblewrap                          # the evaluation gate's sandbox for candidate programs (bwrap)
  crun                                # the OCI runtime Slurm runs a job's image with (oci.conf; docs/IMAGES.md)
  lua5.1                              # runs job_submit.lua in its test (Slurm's job_submit_lua.so links Lua 5.1)
  prometheus                          # promtool checks the textfile-collector output (the server is not started)
)
if [ "${1:-}" = --browser ]; then
  packages+=(chromium chromium-driver python3-selenium)  # the reports as a browser renders them
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${#missing[@]} package(s): ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get update -qq; then
  echo "install-deps: apt-get update failed (no registry?); needed packages: ${missing[*]}" >&2
  exit 1
fi
# Daemons must not be started by the package scripts: the dev cluster starts its own.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null && $SUDO chmod +x "$policy" && created_policy=1
fi
rc=0
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/forge-install-deps.log 2>&1 || rc=$?
[ $created_policy -eq 1 ] && $SUDO rm -f "$policy"
if [ $rc -ne 0 ]; then
  tail -n 20 /tmp/forge-install-deps.log >&2
  echo "install-deps: apt-get install failed (see /tmp/forge-install-deps.log); packages: ${missing[*]}" >&2
  exit 1
fi
echo "install-deps: done"
