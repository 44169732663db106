#!/usr/bin/env bash
# Issue 38's "nothing changes its numbers": runs two `posenc` binaries (OLD,
# NEW) on the same inputs and checks that every number is the same:
#   1. the smoke report's results.json (except the `seconds` fields);
#   2. SmolLM2's loss bands at 4,096 and 16,384 tokens (`perplexity --json`);
#   3. the passkey trials (`passkey --json`, a 2 x 3 grid, 2 trials a cell);
#   4. the first steps of a LoRA fine-tune (metrics.jsonl's losses);
# then times the forward (`perplexity` at 4,096 tokens) and a training step
# (the fine-tune) with the two binaries alternated, 3 rounds.
# Usage: scripts/check/same_numbers.sh OLD NEW [WORKDIR]
set -euo pipefail
old=$1
new=$2
work=${3:-$(mktemp -d)}
cd "$(dirname "$0")/../.."
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
text=assets/corpus/pride-and-prejudice.txt
[ -s "$model" ] || bash scripts/get-model.sh >/dev/null
mkdir -p "$work"
strip_seconds() { python3 -c '
import json, sys
def walk(v):
    if isinstance(v, dict):
        return {k: walk(x) for k, x in v.items() if k != "seconds"}
    if isinstance(v, list):
        return [walk(x) for x in v]
    return v
print(json.dumps(walk(json.load(open(sys.argv[1]))), sort_keys=True))' "$1"; }
same() { # WHAT FILE_OLD FILE_NEW
  if cmp -s "$2" "$3"; then echo "same: $1"; else echo "DIFFERENT: $1 ($2 vs $3)"; status=1; fi
}
status=0
for v in old new; do
  bin=${!v}
  "$bin" report --preset smoke --out "$work/report-$v" >/dev/null 2>&1
  strip_seconds "$work/report-$v/results.json" >"$work/results-$v.json"
  for len in 4096 16384; do
    "$bin" perplexity --model "$model" --text "$text" --length $len --scaling none,self-extend:4:1024 \
      --json --quiet | python3 -c 'import json,sys; d=json.load(sys.stdin); print(json.dumps({k: v["bands"] for k, v in d["scalings"].items()}, sort_keys=True))' >"$work/bands-$len-$v.json"
  done
  "$bin" passkey --model "$model" --lengths 1024,2048 --depths 0,0.5,1 --trials 2 --json --quiet \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); m=d.get("methods") or d["scalings"]; print(json.dumps({k: [{f: r.get(f) for f in ("key","generated","logprob","correct")} for r in v["results"]] for k, v in m.items()}, sort_keys=True))' >"$work/passkey-$v.json"
  rm -rf "$work/ft-$v"
  "$bin" finetune --model "$model" --text "$text" --length 256 --steps 3 --out "$work/ft-$v" --quiet >/dev/null
  python3 -c 'import json,sys; print([json.loads(l).get("loss") for l in open(sys.argv[1])])' "$work/ft-$v/metrics.jsonl" >"$work/finetune-$v.json"
done
same "smoke report results.json (without seconds)" "$work/results-old.json" "$work/results-new.json"
same "SmolLM2 bands at 4,096 tokens" "$work/bands-4096-old.json" "$work/bands-4096-new.json"
same "SmolLM2 bands at 16,384 tokens" "$work/bands-16384-old.json" "$work/bands-16384-new.json"
same "passkey trials" "$work/passkey-old.json" "$work/passkey-new.json"
same "fine-tune's first steps (losses)" "$work/finetune-old.json" "$work/finetune-new.json"
cat "$work/finetune-new.json"
echo "timing (seconds; old and new alternated):"
for round in 1 2 3; do
  for v in old new; do
    bin=${!v}
    t0=$(date +%s.%N)
    "$bin" perplexity --model "$model" --text "$text" --length 4096 --scaling none --json --quiet >/dev/null
    t1=$(date +%s.%N)
    rm -rf "$work/ft-t"
    "$bin" finetune --model "$model" --text "$text" --length 256 --steps 3 --out "$work/ft-t" --quiet >/dev/null
    t2=$(date +%s.%N)
    echo "round $round $v: forward (perplexity 4096) $(echo "$t1 - $t0" | bc) s, fine-tune 3 steps $(echo "$t2 - $t1" | bc) s"
  done
done
exit $status
