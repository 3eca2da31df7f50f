"""Loading a pair: a name or paths to the two models, loaded and checked, as a ``Pair``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Union

from .api import Pair, notice_to_stderr
from .catalog.naming import resolve_models
from .catalog.stores.layouts import find_projector
from .errors import ModelFileError
from .methods import AUTO_KMAX
from .options import GenerationOptions
from .paths import cache_dir
from .prompt_cache.budget import available_memory
from .prompt_cache.cache import PromptCache
from .runtime.gguf_metadata import read_local
from .runtime.model import Model
from .runtime.process import read_vocab
from .runtime.vision import Projector
from .runtime.vocab_match import check_vocab
from .sizes import human_bytes

PathLike = Union[str, os.PathLike]

#: Generations decoded together where the caller leaves it to localspec (as llama-server's automatic slots):
#: they share the context's cells, so more costs little memory; a step of more costs more time.
AUTO_PARALLEL = 4


def history_enabled() -> bool:
    """History's global switch: on unless ``LOCALSPEC_HISTORY`` is off, 0, false or no."""
    return os.environ.get("LOCALSPEC_HISTORY", "on").strip().lower() not in ("off", "0", "false", "no")


def open_prompt_cache(wanted: Union[bool, PromptCache, None], ram: Optional[int], disk: Optional[int],
                      notify: Callable[[str], None]) -> Optional[PromptCache]:
    """The prompt cache ``load`` gives a pair: ``wanted`` itself, none, or one with these budgets (None: the
    defaults) over the cache directory's ``prompts`` folder."""
    if isinstance(wanted, PromptCache):
        return wanted
    if wanted is False or (wanted is None and not prompt_cache_enabled()):
        return None
    cache = PromptCache(ram, None if disk == 0 else prompt_cache_folder(), disk, notify)
    return cache if cache.enabled else None


def prompt_cache_folder() -> Path:
    """Where the prompt cache's disk tier lives: the cache directory's ``prompts`` folder."""
    return cache_dir() / "prompts"


def prompt_cache_enabled() -> bool:
    """The prompt cache's global switch: on unless ``LOCALSPEC_PROMPT_CACHE`` is off, 0, false or no."""
    return os.environ.get("LOCALSPEC_PROMPT_CACHE", "on").strip().lower() not in ("off", "0", "false", "no")


#: The share of the memory left after the weights that a chosen context's KV caches may take.
CONTEXT_SHARE = 0.5
#: Chosen contexts are whole multiples of this many tokens.
CONTEXT_STEP = 1024
#: The smallest context ``fit_context`` chooses, whatever the memory: the default of a plain load.
MIN_CONTEXT = 4096


@dataclass(frozen=True)
class ContextChoice:
    """A context length chosen for a pair, and why, in one sentence for a person."""

    n_ctx: int
    reason: str


def fit_context(target: PathLike, draft: Optional[PathLike] = None, memory: Optional[int] = None,
                parallel: int = 1) -> ContextChoice:
    """The largest context ``target`` was trained for whose KV caches (the target's and the draft's) fit in
    ``CONTEXT_SHARE`` of the memory left after both models' weights; a whole number of ``CONTEXT_STEP``
    tokens, at least ``MIN_CONTEXT`` (or the training context, when that is smaller).

    Args:
        target: the target .gguf (its header says the training context and the KV bytes a token).
        draft: the draft .gguf, whose cache holds the same context; None without one.
        memory: the bytes free (default: the memory available now).
        parallel: the sequences the context will hold: a target's MTP head takes memory for each.
    """
    headers = [read_local(p) for p in (target, draft) if p is not None]
    trained = headers[0].context_length or MIN_CONTEXT
    per_token = sum(h.kv_bytes_per_token() or 0 for h in headers)
    head = max(1, parallel) * headers[0].mtp_bytes_per_token() if per_token else 0
    per_token += head
    free = available_memory() if memory is None else memory
    weights = sum(os.path.getsize(p) for p in (target, draft) if p is not None)
    budget = int(CONTEXT_SHARE * max(0, free - weights))
    fits = budget // per_token // CONTEXT_STEP * CONTEXT_STEP if per_token else trained
    n_ctx = max(min(trained, fits), min(trained, MIN_CONTEXT))
    what = "its KV cache and its MTP head's rows take" if head else "its KV cache takes"
    cache = f"{what} {human_bytes(n_ctx * per_token)}" if per_token else "no KV cache size is known"
    why = "the model's training context" if n_ctx == trained else \
        f"the most of the {trained} the model was trained for that fits" if n_ctx == fits else \
        f"the least localspec chooses, though only {max(fits, 0)} fit"
    return ContextChoice(n_ctx, f"context {n_ctx} tokens: {why}; {cache} ({human_bytes(per_token)} a token), "
                         f"within half of the {human_bytes(max(0, free - weights))} of memory left after the "
                         "weights (--ctx sets it)")


def load(
    target: PathLike,
    draft: Optional[PathLike] = None,
    *,
    n_ctx: Optional[int] = None,
    n_threads: Optional[int] = None,
    n_threads_batch: Optional[int] = None,
    n_gpu_layers: Optional[int] = None,
    verbose: bool = False,
    flash_attn: Optional[bool] = None,
    huge_pages: bool = True,
    defaults: Optional[GenerationOptions] = None,
    draft_k: Optional[int] = None,
    history: Optional[bool] = None,
    notify: Optional[Callable[[str], None]] = None,
    prompt_cache: Union[bool, PromptCache, None] = None,
    cache_ram: Optional[int] = None,
    cache_disk: Optional[int] = None,
    fit: bool = False,
    parallel: Optional[int] = 1,
    mmproj: Union[PathLike, bool, None] = None,
) -> Pair:
    """Load a target model and, optionally, a draft model of the same family.

    Args:
        target: the target .gguf; or a registered pair's name (``"qwen2.5-coder-1.5b"``: its target and
            draft); or a name from the model stores on this machine (``"ollama:qwen2.5-coder:7b"``,
            ``"lmstudio:..."``, ``"hf:ORG/REPO/FILE.gguf"``), as ``localspec models --scan`` lists them.
        draft: the draft .gguf or store name (same vocabulary); ``"auto"`` for the best draft on this
            machine (said through ``notify``); ``"none"`` for no draft; None for a pair's own draft, or
            none with a target file (lookup, history and plain only).
        n_ctx: context length for both models (0: the target's training context; default: the pair's,
            else 4096).
        n_threads: CPU threads for single-token steps, both models (default: the fastest, measured once).
        n_threads_batch: CPU threads for batches: verification and prompts (default: the fastest, measured
            with the steps; or ``n_threads`` when that is given).
        n_gpu_layers: layers to offload for both; -1 all (default on GPU builds), 0 none.
        verbose: show llama.cpp's log for these models.
        flash_attn: force flash attention on or off (default on the CPU: on for contexts of 16384 tokens or
            more, off below; llama.cpp's choice on a GPU).
        huge_pages: on a CPU build under Linux, ask for transparent huge pages for llama.cpp's buffers
            (see ``localspec.runtime.hugepages``); False leaves its pages as they are.
        defaults: generation options used where a call does not give them.
        draft_k: suggested draft length for the draft model (see ``Pair``; default: the pair's).
        history: draft from the target's earlier generations and record new
            ones (default: on, unless the environment sets ``LOCALSPEC_HISTORY=off``).
            The store is opened on the first generation that uses it.
        notify: where one-line notices go (default: stderr): which draft was found, measurements.
        prompt_cache: keep the models' states after each prompt, so a prompt processed once (in another
            conversation, or by an earlier process) is not processed again (default: on, unless the
            environment sets ``LOCALSPEC_PROMPT_CACHE=off``); a ``PromptCache`` to share one; False for none.
        cache_ram: bytes of RAM the prompt cache may hold (default: a quarter of the memory free now, at
            most 8 GiB); 0 for no RAM tier.
        cache_disk: bytes of disk the prompt cache may use, in the cache directory's ``prompts`` folder
            (default: a tenth of the free space there, at most 16 GiB); 0 for no disk tier.
        fit: without ``n_ctx``, the largest context the target was trained for that fits the memory
            (``fit_context``; said through ``notify``), instead of the pair's or 4096.
        parallel: generations the pair can decode together (``Pair.generate_many``, ``serve``'s requests):
            sequences in each model's context, sharing its ``n_ctx`` cells (one unified cache, so one long
            prompt may use them all). Default 1: one generation at a time (``generate_many`` then runs its
            prompts one after another, and says so once). None: ``AUTO_PARALLEL`` (4), as ``serve`` takes.
        mmproj: the target's vision projector (an ``mmproj`` GGUF), so prompts may hold images. Default: the
            one beside the target file (the Hub's and LM Studio's layouts keep it there), or the one Ollama
            pulled with it, if there is one (said through ``notify``); False for none.

    Returns:
        The loaded ``Pair``; ``close()`` it, or use it in a ``with`` block, to free the models.

    Raises:
        ModelFileError: a file is missing, not a GGUF, or fails to load (a projector not made for the target).
        RegistryError: an unknown pair name, or a pair not downloaded yet (the message says how).
        VocabMismatchError: the draft's vocabulary differs from the target's.
    """
    say = notify or notice_to_stderr
    files = resolve_models(target, draft)
    for notice in files.notices:
        say(notice)
    target, draft = files.target, files.draft
    if parallel is None:
        parallel = AUTO_PARALLEL
    if n_ctx is None and fit:
        choice = fit_context(target, draft, parallel=parallel)
        say(f"localspec: {choice.reason}")
        n_ctx = choice.n_ctx
    n_ctx = n_ctx if n_ctx is not None else 4096 if files.n_ctx is None else files.n_ctx  # a pair's 0: its own
    draft_k = draft_k if draft_k is not None else files.draft_k
    # A recurrent target that can roll back keeps snapshots for auto's longest draft (longer ones checkpoint;
    # a context of several sequences keeps none, see Model);
    # a draft model decodes one token at a time, which no rollback undoes, so it checkpoints instead.
    t = Model(target, n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads_batch, n_gpu_layers=n_gpu_layers,
              flash_attn=flash_attn, huge_pages=huge_pages, rollback_tokens=AUTO_KMAX, verbose=verbose,
              n_seq=parallel)
    d = None
    try:
        projector = _projector(t, files.mmproj if mmproj is None and files.mmproj is not None else mmproj, say)
        if draft is not None:
            check_vocab(t.vocab_info(), read_vocab(draft))  # before the draft's weights are loaded
            d = Model(draft, n_ctx=t.n_ctx, n_threads=n_threads, n_threads_batch=n_threads_batch,
                      n_gpu_layers=n_gpu_layers, flash_attn=flash_attn, huge_pages=huge_pages, rollback_tokens=0,
                      verbose=verbose, n_seq=parallel)
            if projector is not None:  # the draft reads a stand-in where the target sees an image
                d.stand_in = projector.stand_in
        if history is None:
            history = history_enabled()
        cache = open_prompt_cache(prompt_cache, cache_ram, cache_disk, say)
        return Pair(t, d, defaults=defaults, draft_k=draft_k, history=history, notify=notify, prompt_cache=cache)
    except BaseException:
        t.close()
        if d is not None:
            d.close()
        raise


def _projector(target: Model, mmproj: Union[PathLike, bool, None], say: Callable[[str], None]) -> Optional[Projector]:
    """The vision projector ``load`` gives ``target`` (attached to it, so that its sequences share it)."""
    if mmproj is False:
        return None
    if mmproj is None or mmproj is True:  # beside the file (the Hub, LM Studio), or in Ollama's manifest
        path = find_projector(target.path)
    else:
        path = Path(mmproj)
    if path is None:
        if mmproj is True:
            raise ModelFileError(f"No mmproj GGUF lies beside {target.path}; give its path (mmproj=..., --mmproj).")
        return None
    try:
        projector = Projector(path, target, verbose=target.verbose)
    except ModelFileError as exc:
        if mmproj is not None:
            raise ModelFileError(f"{exc} (--mmproj none, or mmproj=False, loads the model without it.)") from None
        # a folder of several models holds one's projector: the others load without images, not with an error
        say(f"localspec: {path.name}, found with {target.path.name}, is not its vision projector; images are off "
            "(--mmproj FILE gives one).")
        return None
    if mmproj is None:
        say(f"localspec: images through {path.name}, the projector found with {target.path.name} "
            "(--mmproj none skips it).")
    target.projector = projector
    return projector
