"""The Python API: a loaded pair of models and its ways to generate (``localspec.load`` makes one, in ``loading``).

Layers, each built on the one before: ``engine.Generation`` (token events
over token ids) -> ``Pair.stream`` (text prompt, options checked, events with
text) -> ``Pair.generate`` (a finished ``Result``) -> the CLI.

Options are one ``GenerationOptions`` object; keyword arguments are a
shorthand for ``options.replace(...)``.

Example:
    >>> import localspec
    >>> pair = localspec.load(target="t.gguf", draft="d.gguf")
    >>> r = pair.generate("def fib(n):", max_tokens=64, method="draft", k=4)
    >>> r.text, r.finish_reason, r.stats.acceptance_rate
    >>> opts = localspec.GenerationOptions(temperature=0.7, seed=1)
    >>> pair.generate("def fib(n):", opts)
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

import numpy as np

from .decoding.engine import Generation
from .decoding.plan import DecodingPlan, check_prompt
from .drafting.assembly import Assembly
from .drafting.calibration import ThreadChoice, calibrate, choose_threads, forget
from .drafting.costs import CostCorrection, CostProfile
from .drafting.estimates import AcceptanceEstimate, history_estimates
from .drafting.history import PROMPT_KEEP, HistoryStore, history_dir
from .errors import ConfigError
from .images import Fetch, image_messages, prompt_tokens
from .lanes import Lanes, Prompt
from .methods import AUTO_KMAX, HISTORY, get_method
from .options import GenerationOptions, check_k
from .prompt_cache.cache import PromptCache
from .prompts import chat_text, chat_with_tools, check_length, infill_tokens
from .reasoning.template import reply_reading
from .results import Result, Stream
from .runtime.model import Model
from .runtime.vocabulary import common_prefix as prefix_length
from .sampling.processors import Processing
from .structured.tool_use import ToolUse, may_call, offered, tool_use


def notice_to_stderr(message: str) -> None:
    """Where a pair's one-line notices go by default."""
    print(message, file=sys.stderr, flush=True)


class Pair:
    """A target model and an optional draft model, ready to generate.

    Use ``load`` to create one. Each method call generates once; the models'
    caches keep the longest shared prefix between calls, so a follow-up on
    the same text (a chat turn) only processes what is new. The two models
    share one cache each, so a Pair runs one generation at a time: finish
    or close a stream before starting the next. ``generate_many`` runs
    several together, on the other sequences of a pair loaded with
    ``parallel``.

    Args:
        target: the loaded target model.
        draft: the loaded draft model, or None.
        defaults: options used where a call does not give them.
        draft_k: the draft length suggested for this pair's draft model
            (models.toml's ``k``), used by method "draft" when ``k`` is not given.
        notify: where one-line notices go (default: stderr), e.g. that auto
            mode is measuring this machine for the first time.
        history: True to draft from (and record into) the target's history
            store in the localspec data directory, opened on first use; a
            ``HistoryStore`` to use that one; False for none.
        prompt_cache: saved model states by prompt prefix (``localspec.prompt_cache.cache``), so a prompt
            another conversation, or an earlier process, processed is not processed again; None for none.
    """

    def __init__(self, target: Model, draft: Optional[Model] = None, *,
                 defaults: Optional[GenerationOptions] = None, draft_k: Optional[int] = None,
                 notify: Optional[Callable[[str], None]] = None, history: Union[bool, HistoryStore] = False,
                 prompt_cache: Optional[PromptCache] = None):
        self.target = target
        #: The prompt cache every generation starts from and saves into (None: none).
        self.cache = prompt_cache
        self.draft = draft
        self.defaults = defaults or GenerationOptions()
        self.draft_k = None if draft_k is None else check_k(draft_k, "The suggested draft length k")
        self.notify = notify or notice_to_stderr
        self._profile: Optional[CostProfile] = None
        #: What real rounds have shown about the cost profile (auto decides by both), kept across generations.
        self.cost_correction = CostCorrection()
        #: The measured thread counts and their sweeps (None until measured, or when the caller set the counts).
        self.thread_choice: Optional[ThreadChoice] = None
        self._history = history
        #: What auto has learned about history's guesses (acceptance by match band), kept across generations.
        self.history_alpha = history_estimates()
        #: What generations are built from besides the models: drafters, grammar states, the MTP head.
        self.assembly = Assembly(target, draft)
        #: The models' other sequences, for generations decoded together (``generate_many``).
        self.lanes = Lanes(self)
        self._recording = threading.Lock()  # lanes record into the one history store
        #: Reads an ``http(s)`` image URL in a message (None: such URLs are refused; ``images.fetch_url`` fetches).
        self.fetch: Optional[Fetch] = None

    @property
    def history(self) -> Optional[HistoryStore]:
        """The history store generations draft from and are recorded in (None: history is off)."""
        if self._history is True:
            from filelock import Timeout

            try:
                self._history = HistoryStore(self.target.path, warn=self.notify)
            except (OSError, Timeout) as exc:  # an unwritable home or a stuck lock must not cost the reply
                self.notify(f"localspec: history is off for this session: cannot open the store in "
                            f"{history_dir()} ({exc}).")
                self._history = False
        return self._history if isinstance(self._history, HistoryStore) else None

    def set_history(self, history: Union[bool, HistoryStore],
                    estimates: Optional[dict[int, AcceptanceEstimate]] = None) -> Union[bool, HistoryStore]:
        """Switch history on (True: the target's own store), to another store, or off (False).

        Auto's estimates of history start afresh, or from ``estimates`` (kept and updated in place,
        e.g. to let a series of requests share them). Returns the previous setting.
        """
        previous, self._history = self._history, history
        self.history_alpha = estimates if estimates is not None else history_estimates()
        return previous

    def reset(self) -> None:
        """Empty both models' caches: the next generation processes its whole prompt."""
        self.target.reset()
        if self.draft is not None:
            self.draft.reset()

    def calibrate(self, refresh: bool = False) -> CostProfile:
        """The machine's cost profile for auto mode (cached on disk; measured on first use).

        When the pair was loaded without ``n_threads``, the fastest thread
        count is measured first (also cached) and both models switch to it.
        Measuring takes a few seconds, says so through ``notify``, and leaves
        both models' caches empty (the next generation prefills its prompt).

        Args:
            refresh: measure again instead of reusing the cached profile.
        """
        if self._profile is None or refresh:
            self.choose_threads(refresh)
            choice = self.thread_choice
            checked = choice.checked if choice and choice.threads == self.target.n_threads else None
            self._profile = calibrate(self.target, self.draft, AUTO_KMAX, refresh=refresh, notify=self.notify,
                                      step=checked, head=self.assembly.usable_head(self.notify))
            if choice is not None:
                choice.checked = None  # a check is fresh once
            if refresh:  # a new measurement: what rounds showed about the old one no longer applies
                self.cost_correction = CostCorrection()
        return self._profile

    def choose_threads(self, refresh: bool = False) -> dict[int, float]:
        """Switch both models to the fastest measured thread counts (steps and batches), unless the caller set them.

        Measured once per machine (cached; see ``calibration.choose_threads``); ``thread_choice`` then
        holds both sweeps. A batch count the caller gave is kept.

        Returns:
            seconds per target step at each thread count tried (empty when the caller chose).
        """
        if not self.target.threads_unset:
            return {}
        if self.thread_choice is None or refresh:
            self.thread_choice = choose_threads(self.target, refresh, notify=self.notify)
            choice = self.thread_choice
            for model in (self.target, self.draft):
                if model is not None:
                    model.set_threads(choice.threads,
                                      choice.batch_threads if model.batch_threads_unset else model.n_threads_batch)
        return self.thread_choice.step_seconds

    @property
    def cost_profile(self) -> Optional[CostProfile]:
        """The cost profile auto decides by, if measured or set (None: not yet; ``calibrate`` measures it)."""
        return self._profile

    def set_profile(self, profile: Optional[CostProfile]) -> None:
        """Use this cost profile for auto mode instead of measuring (e.g. to simulate a GPU).

        None forgets it: the next auto generation uses the calibration again. Either way, what
        real rounds showed about the old profile is forgotten.
        """
        self._profile = profile
        self.cost_correction = CostCorrection()

    def close(self) -> None:
        """Free both models.

        If real rounds consistently contradicted the cached cost profile, it is dropped from the cache
        (saying so), so that the next load measures the machine again.
        """
        if self._profile is not None and self._profile.source == "cache":
            wrong = self.cost_correction.disagreement(self._profile)
            if wrong is not None and forget(self.target, self.draft, AUTO_KMAX,
                                            head=self.assembly.opened_head is not None):
                n, shape = wrong
                self.notify(f"localspec: real rounds disagreed with the cached cost profile (verifying {n} tokens "
                            f"took {shape:.2f}x the share of a step it said); it will be measured again next time.")
        self.lanes.close()
        self.assembly.close()
        if self.cache is not None:
            self.cache.flush()  # its disk writes finish first; the cache itself may be shared with other pairs
        self.target.close()
        if self.draft is not None:
            self.draft.close()

    def __enter__(self) -> Pair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- text ------------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        """Raw text to target token ids (BOS added if the model wants it, special tokens parsed)."""
        return self.target.tokenize(text)

    def format_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                    tools: Sequence[Mapping[str, Any]] = ()) -> str:
        """Render chat messages with the chat template stored in the target GGUF.

        Args:
            messages: dicts with role and content; an assistant's earlier ``tool_calls`` and ``tool``
                messages (with ``tool_call_id``) as OpenAI writes them.
            add_generation_prompt: end with the start of the assistant's reply.
            tools: the tools offered, in OpenAI's shape (``structured.tool_use.ToolUse.offered``).

        Raises:
            ConfigError: the GGUF has no chat template, or the template rejects the messages.
        """
        return chat_text(self.target, messages, add_generation_prompt, tools)

    def chat_tokens(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Chat messages to prompt token ids (the template writes any BOS itself)."""
        return self.target.tokenize(self.format_chat(messages), add_special=False)

    # -- generation ----------------------------------------------------------

    def options(self, options: Optional[GenerationOptions] = None, **changes: Any) -> GenerationOptions:
        """Generation options for a call, as ``generate`` and the others build them.

        Args:
            options: the starting options (default: this pair's defaults).
            **changes: single options to change.

        Returns:
            The options with ``changes`` applied, validated.

        Raises:
            ConfigError, SamplingError: a value is out of range.
        """
        base = options if options is not None else self.defaults
        return base.replace(**changes) if changes else base

    def stream(self, prompt: Union[str, Sequence[int]], options: Optional[GenerationOptions] = None,
               **changes: Any) -> Stream:
        """Generate after a raw prompt, yielding TokenEvents as they are decided.

        Args:
            prompt: raw text (tokenized with BOS if the model wants it) or token ids.
            options: the generation options (default: the pair's defaults).
            **changes: single options to change, e.g. ``max_tokens=64``
                (see ``GenerationOptions``).

        Raises:
            ConfigError, SamplingError: an option is out of range (before any work).
            TokenIdError: a token id is outside the target's vocabulary (before any work).
            ContextOverflowError: the prompt does not fit the context.
        """
        opts = self.options(options, **changes)
        if isinstance(prompt, str):
            check_length(self.target, prompt)
            return self._start(self.tokenize(prompt), prompt, opts)
        return self._start(self.target.check_tokens(prompt).tolist(), None, opts)

    def generate(self, prompt: Union[str, Sequence[int]], options: Optional[GenerationOptions] = None,
                 **changes: Any) -> Result:
        """Generate after a raw prompt and return the finished result.

        Args:
            prompt: raw text or token ids.
            options: the generation options (default: the pair's defaults):
                max_tokens, temperature, top_k, top_p, min_p, seed, method, k,
                ngram, stop; see ``GenerationOptions``.
            **changes: single options to change, e.g. ``temperature=0.7``.

        Returns:
            the Result: text, tokens, finish_reason, stats.

        Raises:
            ConfigError, SamplingError: an option is out of range (before any work).
            TokenIdError: a token id is outside the target's vocabulary (before any work).
            ContextOverflowError: the prompt does not fit the context.
        """
        return self.stream(prompt, options, **changes).finish()

    def generate_many(self, prompts: Sequence[Prompt], options: Optional[GenerationOptions] = None, *,
                      return_exceptions: bool = False, **changes: Any) -> list[Any]:
        """Generate for several prompts together and return their results in order.

        Up to ``parallel`` of them (see ``load``) decode at once: each on its own sequence of the models'
        contexts, with its own drafter and acceptance, their tokens verified in one llama.cpp decode per step,
        so each gives exactly what ``generate`` or ``chat`` gives it alone (up to the batch-shape rounding of
        near-ties that any batch size brings). The rest wait for a free sequence. A pair loaded with one
        sequence runs them one after another.

        Args:
            prompts: raw prompts (text or token ids) and conversations (lists of chat messages), mixed freely.
            options: the generation options for all of them (default: the pair's defaults).
            return_exceptions: put a failed prompt's exception in its place in the list instead of raising the
                first one once all have finished.
            **changes: single options to change, e.g. ``max_tokens=64`` (see ``GenerationOptions``).

        Returns:
            A ``Result`` per prompt, in order (or its exception, with ``return_exceptions``).

        Raises:
            ConfigError, SamplingError: an option is out of range, or a prompt is empty (before any work).
        """
        return self.lanes.generate_many(prompts, options, changes, return_exceptions)

    def generate_each(self, prompts: Sequence[Prompt],
                      options: Union[None, GenerationOptions, Sequence[GenerationOptions]] = None,
                      **changes: Any) -> Iterator[tuple[int, Any]]:
        """As ``generate_many``, but each result as soon as it is done: for a script that saves them as they come.

        Args:
            prompts: as ``generate_many``'s.
            options: the generation options for all of them, or a list of one per prompt (default: the pair's).
            **changes: single options to change in each, e.g. ``max_tokens=64`` (see ``GenerationOptions``).

        Returns:
            ``(index, result)`` pairs in the order they finish, ``result`` the prompt's ``Result`` or the exception
            that ended it. Leaving early (a ``break``, Ctrl-C) cancels what runs and starts no more.

        Raises:
            ConfigError, SamplingError: an option is out of range, or a prompt is empty (before any work).
        """
        return self.lanes.each(prompts, options, changes)

    def chat(self, messages: Sequence[Mapping[str, Any]], options: Optional[GenerationOptions] = None, *,
             tools: Union[None, ToolUse, Sequence[Mapping[str, Any]]] = None, tool_choice: Any = None,
             parallel_tool_calls: Optional[bool] = None, template_vars: Optional[Mapping[str, Any]] = None,
             **changes: Any) -> Result:
        """Generate the assistant's reply to chat ``messages`` (dicts with role and content).

        Args:
            messages: the conversation (see ``format_chat``).
            options: the generation options (default: the pair's defaults).
            **changes: single options to change, e.g. ``max_tokens=64`` (see ``GenerationOptions``).
            tools: functions the model may call, in OpenAI's shape (``{"type": "function", "function":
                {"name", "description", "parameters"}}``) or as a ``structured.tool_use.ToolUse``. The reply's
                ``tool_calls`` then holds the calls, their arguments valid against each function's
                ``parameters`` schema, and ``content`` the text around them.
            tool_choice: "auto" (the default: the model decides), "none", "required", or a function's
                name (or OpenAI's ``{"type": "function", "function": {"name": ...}}``).
            parallel_tool_calls: whether one reply may hold several calls (default: yes).
            template_vars: more variables for the chat template (such as ``enable_thinking``); they win over
                what ``think`` sets.

        Returns:
            The finished ``Result``: ``text``, ``tool_calls``, ``finish_reason`` and ``stats``.

        Raises:
            ConfigError: a tool or the choice is malformed, the template cannot write tool calls,
                or tools come with another constraint (``grammar``).
        """
        return self.stream_chat(messages, options, tools=tools, tool_choice=tool_choice,
                                parallel_tool_calls=parallel_tool_calls, template_vars=template_vars,
                                **changes).finish()

    def stream_chat(self, messages: Sequence[Mapping[str, Any]], options: Optional[GenerationOptions] = None, *,
                    tools: Union[None, ToolUse, Sequence[Mapping[str, Any]]] = None, tool_choice: Any = None,
                    parallel_tool_calls: Optional[bool] = None, template_vars: Optional[Mapping[str, Any]] = None,
                    **changes: Any) -> Stream:
        """Like ``chat``, but returns the generation as it runs.

        Args:
            messages: the conversation (see ``format_chat``).
            options: the generation options (default: the pair's defaults).
            tools: as for ``chat``.
            tool_choice: as for ``chat``.
            parallel_tool_calls: as for ``chat``.
            template_vars: as for ``chat``.
            **changes: single options to change (see ``GenerationOptions``).

        Returns:
            A ``Stream`` of TokenEvents; its ``result`` is the ``Result`` once it is done
            (``structured.call_reader.CallReader`` reads tool calls as they stream).

        Raises:
            ConfigError: as for ``chat``.
        """
        asked = self.options(options, **changes)
        use = tool_use(tools, tool_choice, parallel_tool_calls)
        messages, images = image_messages(self.target, messages, self.fetch)
        text, opts = chat_with_tools(self.target, messages, use, asked, template_vars)
        check_length(self.target, text)
        tokens = prompt_tokens(self.target, text, images)
        marks = [] if images else self._boundaries(messages, tokens, lambda m: chat_with_tools(
            self.target, m, use, asked, template_vars)[0])
        return self._start(tokens, text, opts, calls=offered(use) if may_call(use) else None, boundaries=marks)

    def _boundaries(self, messages: Sequence[Mapping[str, Any]], tokens: list[int],
                    render: Callable[[Sequence[Mapping[str, Any]]], str]) -> list[int]:
        """Where in a chat prompt later prompts are likely to part from it, worth a prompt-cache entry each: the
        end of the leading system messages (and tools), and the end of the turns before the last message. Only
        where the template writes the shorter conversation as a prefix of this one."""
        if self.cache is None or not self.cache.enabled or len(messages) < 2 or self.target.cuts_after_load:
            return []  # an attention cache is saved at the end of the reply, which serves every prefix of it
        system = next((i for i, m in enumerate(messages) if m.get("role") not in ("system", "developer")),
                      len(messages))
        marks = []
        for n in sorted({system, len(messages) - 1} - {0, len(messages)}):
            try:
                part = self.target.tokenize(render(messages[:n]), add_special=False)
            except ConfigError:  # a template that cannot end on this message (it wants a user turn)
                continue
            # the partial render ends with the next turn's opening; the shared tokens are what counts
            shared = prefix_length(np.asarray(part, dtype=np.int32), np.asarray(tokens, dtype=np.int32))
            if 0 < shared < len(tokens) - 1:
                marks.append(shared)
        return marks

    def infill(self, prefix: str, suffix: str, options: Optional[GenerationOptions] = None,
               **changes: Any) -> Result:
        """Generate the text between ``prefix`` and ``suffix`` (fill-in-the-middle).

        Args:
            prefix: the text before the gap.
            suffix: the text after it.
            options: the generation options (default: the pair's defaults).
            **changes: single options to change (see ``GenerationOptions``).

        Returns:
            The finished ``Result``; its ``text`` is the middle.

        Raises:
            ConfigError: the target's vocabulary has no fill-in-the-middle tokens.
        """
        return self.stream_infill(prefix, suffix, options, **changes).finish()

    def stream_infill(self, prefix: str, suffix: str, options: Optional[GenerationOptions] = None,
                      **changes: Any) -> Stream:
        """Like ``infill``, but returns the generation as a ``Stream`` of TokenEvents.

        The prompt is the model's own fill-in-the-middle tokens around the two texts, in the layout
        llama.cpp's server gives one file: [BOS] FIM_PRE prefix FIM_SUF suffix FIM_MID (without its
        repository and file-name tokens, and uncut).

        Raises:
            ConfigError: the target's vocabulary has no fill-in-the-middle tokens.
        """
        opts = self.options(options, **changes)
        tokens = infill_tokens(self.target, prefix, suffix)
        return self._start(tokens, prefix + suffix, opts)

    def _start(self, prompt_tokens: list[int], prompt_text: Optional[str], opts: GenerationOptions,
               calls: Optional[frozenset[str]] = None, boundaries: Sequence[int] = ()) -> Stream:
        check_prompt(self.target, self.target.prompt_cells(prompt_tokens))  # before any work, calibration included
        processing = Processing.from_options(opts, self.target.n_vocab)
        self.choose_threads()  # once per machine (cached); plain decoding runs at the fastest count too
        method, k = get_method(opts.method), opts.draft_length(self.draft_k)
        # A method that decides by this machine's costs gets them measured now (once, then cached).
        profile = self.calibrate() if method.adaptive and method.build is not None and k > 0 else None
        drafter = self.assembly.drafter(opts, k, prompt_text, prompt_tokens, notify=self.notify,
                                        history=lambda: self.history, profile=profile,
                                        correction=self.cost_correction, history_alpha=self.history_alpha)
        matcher, reader = reply_reading(self.target, opts, prompt_tokens, prompt_text,
                                        self.assembly.matcher(opts.grammar) if opts.grammar else None)
        plan = DecodingPlan(prompt_tokens, drafter=drafter, k=k, params=opts.sampling, max_tokens=opts.max_tokens,
                            seed=opts.seed, stop=opts.stop, method=opts.method, matcher=matcher,
                            processing=processing, logprobs=opts.logprobs, boundaries=boundaries, reader=reader)
        # the request is whole and checked: only now may it wait for room beside the pair's other generations
        # (a server's stream starts while it waits) and take another lane's cells
        self.lanes.ready(self.target, prompt_tokens, opts.max_tokens)
        g = Generation(self.target, plan, prompt_cache=self.cache)
        store = self.history if opts.history else None
        return Stream(g, prompt_tokens, (lambda done: self._record(store, prompt_tokens, done)) if store else None,
                      calls=calls)

    def _record(self, store: HistoryStore, prompt_tokens: list[int], done: Generation) -> None:
        """Record a finished generation: the prompt's new part (what the cache did not hold) and the reply."""
        fresh = prompt_tokens[done.stats.cached_prompt_tokens:][-PROMPT_KEEP:]
        try:
            with self._recording:
                store.add(fresh + done.tokens, done.stats.drafted_by.get(HISTORY.name, 0),
                          done.stats.accepted_by.get(HISTORY.name, 0))
        except OSError as exc:  # a full or read-only disk must not cost the reply
            self.notify(f"localspec: could not record this generation in {store.path}: {exc.strerror or exc}.")
