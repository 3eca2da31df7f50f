"""The prepared GPU check: CUDA build, real-shaped random models, costs and exactness on the GPU.

One run writes everything as JSON into one folder (``--out``), step by step,
so a run cut short still reports what it did:

1. build: llama-cpp-python 0.3.36 with CUDA (sm_90 by default: H100, H200)
   from the trimmed sdist in the offline bundle ``.gpu_offline/``, installed
   with ``--target`` into ``--site`` (``--build``; a dry run only records the
   command);
2. models: the Qwen2.5-Coder 1.5B target and 0.5B draft with the real files'
   metadata and tensor shapes (``benchmarks/qwen_shapes.json``) and random
   weights, written as F16 with ``gguf`` and quantized to Q4_K_M by llama.cpp;
   the vocabulary is synthetic but of the real size with the real special ids
   (costs depend on its size, not on its texts);
3. calibrate: the verify curve for n = 1..kmax+1, the draft step, the Python
   time per round outside llama.cpp, the time to copy n logits rows, and
   ``localspec calibrate --json`` through the CLI;
4. tests: the tiny-model exactness and distribution tests on this build
   (on a GPU build ``Model`` offloads every layer by default).

Modes:
    python benchmarks/gpu_check.py --dry-run --out DIR      # CPU, tiny scale, no build: what CI runs
    python3 benchmarks/gpu_check.py --build --out DIR       # on the GPU machine, no network needed
    python benchmarks/gpu_check.py --prepare-offline        # beforehand, with the network: fill .gpu_offline/
                                                            #   (sdist, pure-Python deps); copy it beside the checkout
    python benchmarks/gpu_check.py --write-spec             # beforehand: benchmarks/qwen_shapes.json from the real pair
"""
