"""How long ``posenc.Model.generate`` takes to stop after SIGINT.

Sends SIGINT at twelve times during a 3,000-token prompt's prefill and
prints each stop's delay and the worst (issue 36 asks for under a second):

    python scripts/check/ctrl_c_latency.py [MODEL.gguf]

Run it on the wheel to be checked (CI builds it in the dev profile:
``MATURIN_PEP517_ARGS="--profile dev" pip install ./crates/posenc-py``).
"""

import os
import signal
import sys
import threading
import time

import posenc


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else "models/SmolLM2-135M-Instruct.Q4_1.gguf"
    model = posenc.Model.load(path)
    prompt = " ".join(["the river ran past the old mill"] * 400)
    worst = 0.0
    for delay in [0.3, 0.55, 0.8, 1.0, 1.25, 1.5, 1.7, 2.0, 2.5, 3.1, 3.3, 3.6]:
        sent = []
        timer = threading.Timer(delay, lambda: (sent.append(time.perf_counter()), os.kill(os.getpid(), signal.SIGINT)))
        timer.start()
        try:
            model.generate(prompt, max_new_tokens=4)
            print(f"signal at {delay} s: the call ended first")
        except KeyboardInterrupt:
            d = time.perf_counter() - sent[0]
            worst = max(worst, d)
            print(f"signal at {delay} s: stopped after {d:.3f} s")
        finally:
            timer.cancel()
    print(f"worst {worst:.3f} s")


if __name__ == "__main__":
    main()
