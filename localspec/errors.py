"""Typed errors raised by the localspec library.

Every error carries one sentence meant for a person: which file or value is
wrong and what to do about it. The CLI prints ``str(error)`` and nothing else;
library users can catch the specific classes.
"""

from __future__ import annotations


class LocalspecError(Exception):
    """Base class of every error localspec raises on purpose."""


class ModelFileError(LocalspecError):
    """A model file is missing, unreadable, not a GGUF, or failed to load."""


class VocabMismatchError(LocalspecError):
    """Draft and target models do not share a vocabulary."""


class ContextOverflowError(LocalspecError):
    """A prompt does not fit in the model's context window."""


class TokenIdError(LocalspecError, ValueError):
    """A token id is outside the model's vocabulary (or not a whole number)."""


class SamplingError(LocalspecError, ValueError):
    """A sampling parameter is out of range."""


class ConfigError(LocalspecError, ValueError):
    """An option value (method, draft length, threads...) is invalid."""


class ToolsUnsupportedError(ConfigError):
    """Tools were offered to a model whose chat template or vocabulary cannot write calls as localspec reads them."""


class RegistryError(LocalspecError):
    """models.toml is malformed, or a pair name is unknown."""


class HubError(LocalspecError):
    """A download from the Hugging Face Hub failed or gave a file that fails its checksum."""


class BackendError(LocalspecError):
    """llama.cpp reported a failure (decode or cache edit)."""


class GenerationCancelled(LocalspecError):
    """llama.cpp stopped processing a batch because its generation was cancelled (``Stream.cancel``)."""


class InterleavedGenerationError(LocalspecError):
    """Two generations were interleaved on the same models (they share one cache)."""


class NotInstalledError(LocalspecError):
    """An optional part of localspec (an extra such as 'structured') is not installed here."""
