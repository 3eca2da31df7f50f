"""localspec: fast local generation with speculative decoding over llama.cpp.

The output is what plain decoding of the target model gives (identical tokens
when greedy, the same distribution when sampling); a draft model or prompt
lookup only makes it faster where the hardware allows.

The names below are imported on first use, so ``import localspec`` (and the
``localspec`` command's start-up) does not load llama.cpp until a model is needed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "load": "loading", "Pair": "api", "Result": "results", "Stream": "results",
    "GenerationOptions": "options", "SamplingParams": "options",
    "GenerationStats": "events", "TokenEvent": "events",
    "BackendError": "errors", "ConfigError": "errors", "ContextOverflowError": "errors",
    "InterleavedGenerationError": "errors", "LocalspecError": "errors", "ModelFileError": "errors",
    "SamplingError": "errors", "TokenIdError": "errors", "VocabMismatchError": "errors",
    "ToolsUnsupportedError": "errors",
    "RegistryError": "errors", "HubError": "errors", "NotInstalledError": "errors",
    "Constraint": "constraint",
    "load_embedding": "embeddings", "Embedder": "embeddings",
}

__all__ = sorted(_EXPORTS) + ["__version__"]

if TYPE_CHECKING:  # the real imports, for type checkers and editors
    from .api import Pair
    from .constraint import Constraint
    from .embeddings import Embedder, load_embedding
    from .errors import (
        BackendError,
        ConfigError,
        ContextOverflowError,
        HubError,
        InterleavedGenerationError,
        LocalspecError,
        ModelFileError,
        NotInstalledError,
        RegistryError,
        SamplingError,
        TokenIdError,
        ToolsUnsupportedError,
        VocabMismatchError,
    )
    from .events import GenerationStats, TokenEvent
    from .loading import load
    from .options import GenerationOptions, SamplingParams
    from .results import Result, Stream


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'localspec' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
