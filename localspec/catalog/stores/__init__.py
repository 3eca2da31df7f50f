"""Find the GGUF models already on this machine.

People who try localspec usually have GGUF files already, pulled by another
tool. This package lists them from the places those tools keep them and
reads each one's header (only the key/value section, see ``localspec.runtime.gguf_metadata``);
``localspec.catalog.pairing`` groups them into target/draft pairs that share a
vocabulary. It never writes, moves or copies anything.

Stores and their layouts:

* **Ollama** (``$OLLAMA_MODELS``, else ``~/.ollama/models`` and, on Linux,
  the system service's ``/usr/share/ollama/.ollama/models``): a JSON manifest per
  model at ``manifests/<registry>/<namespace>/<model>/<tag>``; the layer whose
  ``mediaType`` is ``application/vnd.ollama.image.model`` names the GGUF by its
  ``digest`` ``sha256:<hex>``, stored as ``blobs/sha256-<hex>``. Named
  ``ollama:<model>:<tag>``, with ``<namespace>/`` in front unless it is
  ``library`` and ``<registry>/`` unless it is ``registry.ollama.ai``.
* **LM Studio** (``~/.lmstudio/models``, and the older ``~/.cache/lm-studio/models``):
  ``<publisher>/<repo>/<file>.gguf``. Named ``lmstudio:<publisher>/<repo>/<file>``.
* **Hugging Face cache** (``hub.hub_cache_dir()``): ``models--<org>--<name>/snapshots/<rev>/<file>``,
  each a symlink into ``blobs/``. Named ``hf:<org>/<name>/<file>``.
* **llama.cpp's cache** (``$LLAMA_CACHE``, else ``$XDG_CACHE_HOME/llama.cpp`` or
  ``~/.cache/llama.cpp``; ``~/Library/Caches/llama.cpp`` on macOS): ``-hf``
  downloads saved flat as ``<org>_<repo>_<file>.gguf`` (named ``llamacpp:<file>``);
  newer releases keep Hugging Face's ``models--<org>--<name>`` layout there
  (named ``llamacpp:<org>/<name>/<file>``).
* **Folders the user names**: every ``*.gguf`` under them, to a bounded depth. Named by path.

Decisions:

* A file reached twice (an HF snapshot and a symlink in LM Studio's folder, the same
  Ollama blob under two tags, a named folder inside a store) is listed once, under
  the first name found (stores in the order above); the other names are kept in
  ``FoundModel.aliases`` and ``resolve_name`` accepts them all.
* A split model (``name-00001-of-00003.gguf``, gguf-split) is listed once, as its
  first part, which is what llama.cpp loads (it opens the other parts itself); its
  size is the sum of the parts. If a part is missing it is skipped with a reason.
* Multimodal projectors (``mmproj``), LoRA adapters and other files whose
  ``general.type`` is not ``model`` are skipped with a reason: they cannot
  generate text.
* A store that does not exist is normal and silent; everything else that
  cannot be listed is reported as a ``Skipped`` (and through ``say``).

Layer: catalog, above ``runtime``.
"""

from .found import STORES, FoundModel, Roots, Say, Scan, Skipped, llamacpp_roots, lmstudio_roots, ollama_roots
from .layouts import ollama_name
from .names import PREFIXES, is_store_name, resolve_name
from .reading import DEFAULT_DEPTH, first_part, read_model, scan

__all__ = ["DEFAULT_DEPTH", "PREFIXES", "STORES", "FoundModel", "Roots", "Say", "Scan", "Skipped", "first_part",
           "is_store_name", "llamacpp_roots", "lmstudio_roots", "ollama_name", "ollama_roots", "read_model",
           "resolve_name", "scan"]
