"""Where the GPU check's files are, what it builds with, and which tests it runs."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "benchmarks" / "qwen_shapes.json"
LLAMA_VERSION = "0.3.36"
OFFLINE = REPO / ".gpu_offline"
SDIST_NAME = f"llama_cpp_python-{LLAMA_VERSION}.tar.gz"
DEFAULT_SITE = Path("/tmp/localspec-gpu/site")
DEFAULT_WORK = Path("/tmp/localspec-gpu/work")
REAL_MODELS = Path.home() / ".cache" / "localspec" / "test-models"
#: Compute capability 9.0 by default, that of the H100 and H200 (set another here for another GPU). The CPU
#: part is built portable, as scripts/install.sh does (a native build enables ggml's AMX kernels, which crash
#: in VMs without AMX state); mtmd (LLAVA) is not needed.
CUDA_CMAKE_ARGS = ("-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON "
                   "-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON")
#: Paths in the sdist that no build step reads (under its top folder): git packs, docs, vocab test files,
#: benchmark results, the server's web UI and assets. The sdist is 77 MB; without these about 10.
SDIST_TRIM = (".git/", "vendor/llama.cpp/.git", "vendor/llama.cpp/docs/", "vendor/llama.cpp/models/",
              "vendor/llama.cpp/benches/", "vendor/llama.cpp/tools/ui/", "vendor/llama.cpp/tools/server/",
              "vendor/llama.cpp/media/", "vendor/llama.cpp/.github/")
#: Pure-Python packages localspec, llama_cpp and the model writer need that the GPU machine's Python may
#: lack: the offline bundle holds copies of them.
OFFLINE_PACKAGES = ("gguf", "platformdirs", "tomli_w", "prompt_toolkit", "wcwidth", "diskcache")
#: Greedy identical to plain, sampled distribution kept, KV truncation right: the tiny-model tests for them.
EXACTNESS_TESTS = (
    "tests/decoding/test_engine_tiny.py", "tests/sampling/test_acceptance.py", "tests/drafting/test_auto.py",
    "tests/drafting/test_history.py::test_greedy_with_history_equals_plain_decoding_and_a_repeat_is_drafted_from_history",
    "tests/drafting/test_history.py::test_wrong_history_is_rejected_and_the_output_stays_exact",
    "tests/drafting/test_history.py::test_sampled_history_drafts_keep_the_plain_distribution",
    # the prompt cache: a state saved from the GPU and restored (RAM and disk) gives the live context's tokens
    "tests/prompt_cache/test_prompt_cache.py::test_interleaved_conversations_restored_from_ram_and_disk_give_the_live_contexts_tokens",
    "tests/prompt_cache/test_prompt_cache.py::test_a_restore_at_a_message_boundary_followed_by_a_divergent_last_turn_is_exact",
    "tests/prompt_cache/test_prompt_cache.py::test_a_sampled_reply_after_a_restore_is_the_same_sample",
)
#: The dry run's few: greedy exactness and the caches after rejections, on the same path.
DRY_RUN_TESTS = ("tests/decoding/test_engine_tiny.py::test_greedy_speculation_matches_plain_decoding",
                 "tests/decoding/test_engine_tiny.py::test_after_rejections_both_caches_equal_a_fresh_context")
QK_K = 256  # K-quant block: a row length that is a multiple of it quantizes to Q4_K/Q6_K, not a fallback
DRY_RUN_SCALE = 0.02

