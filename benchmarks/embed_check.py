"""An embedding model through localspec against llama-cpp-python's own ``embed``, on the same file and threads:
how close the vectors are (the least cosine similarity over the inputs) and how long a batch of inputs takes,
repetitions interleaved, medians.

    python benchmarks/embed_check.py MODEL.gguf [--inputs 56] [--reps 7] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

SENTENCES = ("The server listens on port 8000 and answers OpenAI's API.",
             "Paris is the capital of France, on the Seine.",
             "def add(a, b):\n    return a + b",
             "A kitten is a young cat; it sleeps most of the day.",
             "Speculative decoding checks several guessed tokens in one pass of the model.",
             "The stock market fell sharply on Tuesday after the announcement.",
             "Mix the flour and the butter, then add the eggs one at a time.")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--inputs", type=int, default=56)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import llama_cpp

    import localspec

    texts = [f"search_document: {SENTENCES[i % len(SENTENCES)]} (passage {i})" for i in range(args.inputs)]
    ours = localspec.load_embedding(args.model, n_threads=args.threads)
    theirs = llama_cpp.Llama(args.model, embedding=True, n_ctx=ours.n_ctx, n_batch=ours.n_ctx, n_ubatch=ours.n_ctx,
                             n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    a = ours.embed(texts)
    b = np.array(theirs.embed(texts, normalize=True), dtype=np.float32)
    cosine = (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    print(f"{args.inputs} inputs, {ours.name} ({ours.pooling} pooling, {ours.dim} numbers, up to {ours.n_ctx} tokens "
          f"an input), {args.threads} threads: least cosine similarity to llama-cpp-python's {cosine.min():.6f}")
    seconds: dict[str, list[float]] = {"localspec": [], "llama-cpp-python": []}
    runs = {"localspec": lambda: ours.embed(texts), "llama-cpp-python": lambda: theirs.embed(texts, normalize=True)}
    for rep in range(args.reps):
        for name in (list(runs) if rep % 2 == 0 else list(reversed(runs))):  # the order alternates
            t0 = time.perf_counter()
            runs[name]()
            seconds[name].append(time.perf_counter() - t0)
    mine, peer = (statistics.median(seconds[k]) for k in runs)
    print(f"a batch of {args.inputs}: localspec {mine * 1000:.0f} ms, llama-cpp-python {peer * 1000:.0f} ms, "
          f"ratio {mine / peer:.3f} (medians of {args.reps}; each: "
          + ", ".join(f"{x / y:.3f}" for x, y in zip(seconds["localspec"], seconds["llama-cpp-python"], strict=True))
          + ")")
    ours.close()
    theirs.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
