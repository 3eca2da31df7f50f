"""Generation options: one frozen, validated object that every caller builds or ``replace``s.

``SamplingParams`` is how the next token is chosen from a logits row (the
acceptance layer needs nothing else). ``GenerationOptions`` adds how a
generation runs: how many tokens, the seed, the drafting method and its
draft length, the lookup n-gram range. Both validate on construction, so a
bad value fails with one sentence before any model work, and the CLI, the
chat commands, the bench and the API share the same bounds and defaults.

This module imports nothing heavy (no numpy, no llama.cpp), so the CLI can
build its options from it at start-up.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from .constraint import Constraint
from .errors import ConfigError, SamplingError
from .methods import AUTO, AUTO_KMAX, K_LIMIT, REGISTRY

#: The n-gram lengths prompt lookup matches, (shortest, longest): a long match pins a copy to its place in the
#: source, so the first of several occurrences of a short phrase does not send the draft elsewhere.
LOOKUP_NGRAM = (1, 5)
#: The most stop strings one generation takes.
MAX_STOPS = 16
#: The longest stop string, in characters (the matcher looks back that far at every token).
MAX_STOP_CHARS = 256
#: The seed that asks for a random one, as llama.cpp spells it (LLAMA_DEFAULT_SEED).
RANDOM_SEED = -1
#: The largest ``logit_bias`` value either way, and the most biased tokens (OpenAI's bounds).
MAX_BIAS = 100.0
MAX_BIASED = 1024
#: The longest window the penalties look back over.
MAX_LAST_N = 1 << 16
#: The most alternatives ``logprobs`` gives per token (OpenAI's ``top_logprobs`` bound).
MAX_LOGPROBS = 20
#: The largest reasoning budget, in tokens.
MAX_THINK_BUDGET = 1 << 20


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _is_whole(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _bias_pairs(value: object) -> tuple[tuple[int, float], ...]:
    """``logit_bias`` as sorted (token id, bias) pairs, from a mapping, pairs, or ``"ID=BIAS"`` strings.

    Raises:
        SamplingError: an id that is not a whole number >= 0, a bias outside +-MAX_BIAS, or too many.
    """
    items = value.items() if isinstance(value, dict) else value
    if not isinstance(items, (tuple, list, type({}.items()))):
        raise SamplingError(f"logit_bias must map token ids to biases, got {type(value).__name__}.")
    pairs: dict[int, float] = {}
    item: Any
    for item in items:
        if isinstance(item, str):
            token_text, eq, bias_text = item.partition("=")
            try:
                item = (int(token_text), float(bias_text)) if eq and re.fullmatch(r"\s*[0-9]{1,10}\s*", token_text) \
                    else None
            except ValueError:
                item = None
            if item is None:
                raise SamplingError(f"logit_bias {value!r}: give each as ID=BIAS, e.g. 1234=-100.")
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise SamplingError(f"logit_bias must map token ids to biases, got the entry {item!r}.")
        token, bias = item
        if isinstance(token, str) and re.fullmatch(r"[0-9]{1,10}", token.strip()):
            token = int(token)  # JSON object keys are strings (ASCII digits: "²" is a digit to isdigit)
        if not _is_whole(token) or token < 0:
            raise SamplingError(f"logit_bias token ids are whole numbers >= 0, got {repr(token)[:40]}.")
        if not _is_number(bias) or not -MAX_BIAS <= bias <= MAX_BIAS:
            raise SamplingError(f"logit_bias values are numbers from -{MAX_BIAS:g} to {MAX_BIAS:g}, got {bias!r} "
                                f"for token {token}.")
        pairs[token] = float(bias)
    if len(pairs) > MAX_BIASED:
        raise SamplingError(f"logit_bias may name at most {MAX_BIASED} tokens, got {len(pairs)}.")
    return tuple(sorted(pairs.items()))


def check_k(k: object, what: str = "The draft length k") -> int:
    """Return ``k`` if it is a whole number from 0 to K_LIMIT, else raise ConfigError."""
    if not _is_whole(k) or not 0 <= k <= K_LIMIT:  # type: ignore[operator]
        raise ConfigError(f"{what} must be a whole number from 0 to {K_LIMIT}, got {k!r}.")
    return k  # type: ignore[return-value]


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen from a logits row.

    The filters run in llama.cpp's order: top-k, then top-p, then min-p on
    the untempered distribution, and the temperature last, over what is left.

    Attributes:
        temperature: 0 for greedy (argmax) decoding, otherwise > 0.
        top_k: keep the k most likely tokens; 0 disables.
        top_p: keep the smallest set of tokens whose mass reaches top_p; 1 disables.
        min_p: drop tokens below min_p times the top probability; 0 disables.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        t, k, p, m = self.temperature, self.top_k, self.top_p, self.min_p
        if not _is_number(t) or t < 0:
            raise SamplingError(f"temperature must be a finite number >= 0 (0 means greedy), got {t!r}.")
        if not _is_whole(k) or k < 0:
            raise SamplingError(f"top_k must be a whole number >= 0 (0 disables it), got {k!r}.")
        if not _is_number(p) or not (0 < p <= 1):
            raise SamplingError(f"top_p must be in (0, 1] (1 disables it), got {p!r}.")
        if not _is_number(m) or not (0 <= m <= 1):
            raise SamplingError(f"min_p must be in [0, 1] (0 disables it), got {m!r}.")

    @property
    def greedy(self) -> bool:
        """True when decoding takes the argmax."""
        return self.temperature == 0


def _opt(default: Any, help: str, *flags: str) -> Any:
    """A field with the help text and flag names the CLI builds its options from (no flags: not on the CLI)."""
    return field(default=default, metadata={"help": help, "flags": flags})


@dataclass(frozen=True)
class GenerationOptions:
    """Everything that shapes one generation, validated on construction.

    Build one, or change one with ``replace`` (which validates again)::

        opts = GenerationOptions(max_tokens=128, method="lookup")
        opts = opts.replace(temperature=0.7, seed=1)

    Attributes:
        max_tokens: most tokens to generate.
        temperature: 0 for greedy decoding, otherwise sampling.
        top_k, top_p, min_p: sampling filters (0, 1.0 and 0.0 turn them off).
        seed: seed for sampling (None, or -1 as in llama.cpp: a random one).
        method: "auto" (default: picks prompt lookup, history, the draft
            model or plain decoding and K each round from measured costs),
            "draft" (needs a draft model), "lookup", "history" (what followed
            the same text in earlier generations), "prediction" (drafts from
            ``prediction``), "mtp" (the target's own multi-token-prediction
            head) or "plain".
        k: tokens drafted per round; None for the method's default (draft 4,
            or the pair's suggestion; lookup and history 8; for auto the most, 8).
        ngram: (min, max) n-gram lengths prompt lookup matches.
        stop: strings that end the generation; the text is cut where the
            first one begins (it is not included) and finish_reason is "stop".
        history: draft from this model's earlier generations and record
            this one (when the pair has a history store; see ``localspec.load``).
        grammar: what the output must follow (``constraint.Constraint``: a JSON schema, JSON mode,
            a regex, a Lark or GBNF grammar); None for free text. Every method stays exact under it.
        logit_bias: (token id, bias) pairs added to those logits (a dict, or ``"ID=BIAS"`` strings, is
            turned into them), as OpenAI's ``logit_bias``.
        repeat_penalty, frequency_penalty, presence_penalty: llama.cpp's penalties over the last
            ``repeat_last_n`` generated tokens (see ``localspec.sampling.processors``). Every method stays exact
            under them and the bias.
        prediction: text the output is expected to be (much) like; auto drafts from it where the reply
            matches it (method "prediction": only from it). The output stays plain decoding's.
        logprobs: None, or give every token its log-probability under the processed logits it was chosen
            from (bias, penalties and grammar applied, at temperature 1) and this many likeliest alternatives.
        think: for a reasoning model, True to let it think before it answers, False to have it answer at once
            (through its template's switch, and by closing any reasoning it starts all the same); None as its
            template has it. Other models ignore it.
        think_budget: the most tokens a reasoning model thinks for; then it is made to close its reasoning
            (its own closing tokens are written for it) and the answer follows. None: no limit.
    """

    max_tokens: int = _opt(256, "Most tokens to generate.", "--max-tokens", "-n")
    temperature: float = _opt(0.0, "0 for greedy decoding; above 0 samples.", "--temperature", "--temp")
    top_k: int = _opt(0, "Keep the k likeliest tokens (0: off).", "--top-k")
    top_p: float = _opt(1.0, "Nucleus sampling mass (1: off).", "--top-p")
    min_p: float = _opt(0.0, "Drop tokens below min-p times the top probability (0: off).", "--min-p")
    seed: Optional[int] = _opt(None, "Sampling seed (default or -1: random).", "--seed")
    method: str = _opt(AUTO.name, "How to draft: auto picks prompt lookup, history, the draft model or plain "
                               "decoding (and K) each round from this machine's measured costs.", "--method", "-m")
    k: Optional[int] = _opt(None, f"Tokens drafted per round (one pass of the model that checks them), 0 to {K_LIMIT} "
                                  f"(default: 4 for draft or the pair's "
                                  f"suggestion, 8 for lookup; for auto the most, {AUTO_KMAX}).", "--k", "-k")
    ngram: tuple[int, int] = _opt(LOOKUP_NGRAM, "Lookup n-gram lengths (min, max).")
    stop: tuple[str, ...] = _opt((), "Stop where this text appears, without it (repeatable).", "--stop")
    history: bool = _opt(True, "Draft from this model's earlier generations, and record this one.",
                         "--history/--no-history")
    grammar: Optional[Constraint] = _opt(None, "What the output must follow (a JSON schema, a regex, a grammar).")
    logit_bias: tuple[tuple[int, float], ...] = _opt(
        (), f"Add BIAS to token ID's logit, as ID=BIAS (BIAS from -{MAX_BIAS:g} to {MAX_BIAS:g}; repeatable).",
        "--logit-bias")
    repeat_penalty: float = _opt(1.0, "llama.cpp's repeat penalty: divide a positive logit (multiply a negative one) "
                                      "of tokens among the last --repeat-last-n generated (1: off).",
                                 "--repeat-penalty")
    frequency_penalty: float = _opt(0.0, "Lower a token's logit by this times its count among them (-2 to 2; 0: off).",
                                    "--frequency-penalty")
    presence_penalty: float = _opt(0.0, "Lower the logit of every token among them by this (-2 to 2; 0: off).",
                                   "--presence-penalty")
    repeat_last_n: int = _opt(64, "How many of the latest generated tokens the penalties look at.", "--repeat-last-n")
    prediction: Optional[str] = _opt(None, "The output you expect, or most of it (as OpenAI's predicted outputs): "
                                           "drafted from wherever the reply matches it.", "--prediction")
    logprobs: Optional[int] = _opt(None, f"Give each token's log-probability and the N likeliest alternatives "
                                         f"(0 to {MAX_LOGPROBS}).", "--logprobs")
    think: Optional[bool] = _opt(None, "Let a reasoning model think before it answers, or not (default: as its "
                                       "chat template has it).", "--think/--no-think")
    think_budget: Optional[int] = _opt(None, "Most tokens a reasoning model may think for; then its reasoning is "
                                             "closed for it and the answer follows.", "--think-budget")

    def __post_init__(self) -> None:
        SamplingParams(self.temperature, self.top_k, self.top_p, self.min_p)  # checks the sampling values
        if not _is_whole(self.max_tokens) or self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be a whole number >= 1, got {self.max_tokens!r}.")
        if self.seed == RANDOM_SEED and _is_whole(self.seed):
            object.__setattr__(self, "seed", None)  # frozen: the one normalisation done in place
        if self.seed is not None and not (_is_whole(self.seed) and self.seed >= 0):
            raise ConfigError(f"seed must be a whole number >= 0 (or -1 or None for a random one), got {self.seed!r}.")
        REGISTRY.get(self.method)  # raises ConfigError naming the methods there are
        if self.k is not None:
            check_k(self.k)
        ng = self.ngram
        if not (isinstance(ng, tuple) and len(ng) == 2 and all(_is_whole(n) for n in ng) and 1 <= ng[0] <= ng[1]):
            raise ConfigError(f"The lookup n-gram range must be (min, max) with 1 <= min <= max, got {ng!r}.")
        if not (isinstance(self.stop, tuple) and all(isinstance(x, str) and x for x in self.stop)):
            raise ConfigError(f"stop must be a list of non-empty strings, got {self.stop!r}.")
        if self.grammar is not None and not isinstance(self.grammar, Constraint):
            raise ConfigError(f"grammar must be a localspec Constraint (Constraint.json_schema(...), .regex(...), "
                              f".lark(...), .gbnf(...)), got {type(self.grammar).__name__}.")
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))  # frozen: normalised like seed
        self._check_penalties()
        if self.prediction is not None and not (isinstance(self.prediction, str) and _is_utf8(self.prediction)):
            raise ConfigError("prediction must be text (the output you expect).")
        lp = self.logprobs
        if lp is not None and not (_is_whole(lp) and 0 <= lp <= MAX_LOGPROBS):
            raise ConfigError(f"logprobs must be a whole number from 0 to {MAX_LOGPROBS} (the likeliest "
                              f"alternatives to give with each token), got {lp!r}.")
        if self.think is not None and not isinstance(self.think, bool):
            raise ConfigError(f"think must be true, false or unset, got {self.think!r}.")
        b = self.think_budget
        if b is not None and not (_is_whole(b) and 0 <= b <= MAX_THINK_BUDGET):
            raise ConfigError(f"think_budget must be a whole number of tokens from 0 to {MAX_THINK_BUDGET}, "
                              f"got {b!r}.")
        if not isinstance(self.history, bool):
            raise ConfigError(f"history must be true or false, got {self.history!r}.")
        if len(self.stop) > MAX_STOPS:
            raise ConfigError(f"At most {MAX_STOPS} stop strings are allowed, got {len(self.stop)}.")
        if not all(map(_is_utf8, self.stop)):
            raise ConfigError("A stop string is not valid Unicode text (it has a lone surrogate).")
        longest = max(map(len, self.stop), default=0)
        if longest > MAX_STOP_CHARS:
            raise ConfigError(f"A stop string may be at most {MAX_STOP_CHARS} characters long, got one of {longest}.")

    def _check_penalties(self) -> None:
        r, f, p, n = self.repeat_penalty, self.frequency_penalty, self.presence_penalty, self.repeat_last_n
        if not _is_number(r) or not 1e-3 <= r <= 100:
            raise SamplingError(f"repeat_penalty must be a number from 0.001 to 100 (1 turns it off), got {r!r}.")
        for name, value in (("frequency_penalty", f), ("presence_penalty", p)):
            if not _is_number(value) or not -2 <= value <= 2:
                raise SamplingError(f"{name} must be a number from -2 to 2 (0 turns it off), got {value!r}.")
        if not _is_whole(n) or not 0 <= n <= MAX_LAST_N:
            raise SamplingError(f"repeat_last_n must be a whole number from 0 to {MAX_LAST_N}, got {n!r}.")

    @property
    def sampling(self) -> SamplingParams:
        """The sampling part, for the acceptance layer."""
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.min_p)

    def draft_length(self, suggested_draft_k: Optional[int] = None) -> int:
        """``k``, or the method's default (``suggested_draft_k`` for the draft model's methods when given)."""
        if self.k is not None:
            return self.k
        method = REGISTRY.get(self.method)
        if method.needs_draft and suggested_draft_k is not None:
            return suggested_draft_k
        return method.default_k

    def replace(self, **changes: Any) -> GenerationOptions:
        """A copy with ``changes`` applied and validated.

        Raises:
            ConfigError: an unknown option name or an invalid value.
            SamplingError: an invalid sampling value.
        """
        unknown = set(changes) - set(OPTION_NAMES)
        if unknown:
            raise ConfigError(f"Unknown generation option {sorted(unknown)[0]!r}; "
                              f"known options: {', '.join(OPTION_NAMES)}.")
        for name in ("ngram", "stop"):  # JSON and keyword callers give lists
            if isinstance(changes.get(name), list):
                changes[name] = tuple(changes[name])
        if isinstance(changes.get("stop"), str):
            changes["stop"] = (changes["stop"],)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (for JSON: saved chat settings, bench reports)."""
        return dataclasses.asdict(self)


#: The option names, in declaration order.
OPTION_NAMES = tuple(f.name for f in dataclasses.fields(GenerationOptions))
