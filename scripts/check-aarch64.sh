#!/usr/bin/env bash
# Builds the library for aarch64 and runs its kernel and tensor-RoPE tests
# under qemu user-mode emulation, so the NEON kernels are checked against the
# reference path on an x86-64 machine (Debian/Ubuntu; needs root for apt-get).
# Not part of .ci/run: cross-compiling candle takes about 15 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v qemu-aarch64 >/dev/null || ! command -v aarch64-linux-gnu-gcc >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross
fi
rustup target add aarch64-unknown-linux-gnu
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
cargo clippy -p posenc --target aarch64-unknown-linux-gnu --lib -- -D warnings
cargo test -p posenc --target aarch64-unknown-linux-gnu --test integration -- --nocapture kernels:: tensor_rope:: 2>&1 \
  | grep -E "levels:|test result|FAILED|panicked"
