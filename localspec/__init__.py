"""localspec: fast local generation with speculative decoding over llama.cpp.

The output is what plain decoding of the target model gives (identical tokens
when greedy, the same distribution when sampling); a draft model or prompt
lookup only makes it faster where the hardware allows.
"""

from .acceptance import SamplingParams
from .api import Pair, Result, Stream, load
from .engine import GenerationStats, TokenEvent
from .errors import (
    BackendError,
    ConfigError,
    ContextOverflowError,
    LocalspecError,
    ModelFileError,
    SamplingError,
    VocabMismatchError,
)

__version__ = "0.1.0"

__all__ = [
    "BackendError", "ConfigError", "ContextOverflowError", "GenerationStats", "LocalspecError",
    "ModelFileError", "Pair", "Result", "SamplingError", "SamplingParams", "Stream", "TokenEvent",
    "VocabMismatchError", "load", "__version__",
]
