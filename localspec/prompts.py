"""Prompts from what a caller gives: chat messages through the GGUF's chat template, a fill-in-the-middle
prompt from a prefix and a suffix, and the check that a text can fit the context at all."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from .errors import ConfigError, ContextOverflowError
from .options import GenerationOptions
from .reasoning.template import model_reasoning
from .runtime.model import Model
from .structured.tool_use import ToolUse, reply_options, template_messages

#: What the renderer gives every template itself: a template variable may not be set under these names.
RESERVED_VARIABLES = frozenset({"messages", "tools", "add_generation_prompt", "eos_token", "bos_token",
                                "raise_exception", "functions", "function_call", "tool_choice", "strftime_now"})


def check_messages(messages: Sequence[Mapping[str, Any]]) -> None:
    """Refuse chat messages a template cannot render as meant, in one sentence that names the message: each
    is an object with a role and its content (text, or a list of parts), which only an assistant turn that
    calls tools may leave out.

    Raises:
        ConfigError: the list is empty or not a list, or a message is not an object, has no role or no content.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ConfigError('Chat messages must be a non-empty list of {"role": ..., "content": ...} objects.')
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ConfigError(f'Message {i} is {type(m).__name__}, not a {{"role": ..., "content": ...}} object.')
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise ConfigError(f'Message {i} has no role; give "role": "system", "user", "assistant" or "tool".')
        content = m.get("content")
        if content is None and not (role == "assistant" and m.get("tool_calls")):
            raise ConfigError(f'Message {i} ({role}) has no content; give its text as "content".')
        if content is not None and not isinstance(content, (str, list)):
            raise ConfigError(f'Message {i} ({role}): "content" must be text, not {type(content).__name__}.')


def chat_text(target: Model, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
              tools: Sequence[Mapping[str, Any]] = (), variables: Optional[Mapping[str, Any]] = None) -> str:
    """Chat messages rendered with the chat template stored in ``target``'s GGUF (see ``Pair.format_chat``).

    Args:
        variables: more variables for the template (such as ``enable_thinking``).

    Raises:
        ConfigError: the messages are malformed (see ``check_messages``), the GGUF has no chat template, the
            template rejects them, or a variable is one the renderer sets itself.
    """
    check_messages(messages)
    taken = sorted(RESERVED_VARIABLES.intersection(variables or {}))
    if taken:
        raise ConfigError(f"The template variable {taken[0]!r} is set by localspec itself; leave it out.")
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = target.chat_template()
    if not template:
        raise ConfigError(
            f"{target.path.name} has no chat template in its metadata; "
            "use a raw prompt (--prompt) instead of chat messages."
        )
    formatter = Jinja2ChatFormatter(
        template=template,
        eos_token=target.special_text(target.eos),
        bos_token=target.special_text(target.bos),
        add_generation_prompt=add_generation_prompt,
    )
    try:
        return formatter(messages=template_messages(messages),  # type: ignore[arg-type]
                         tools=list(tools) or None, **(variables or {})).prompt  # type: ignore[arg-type]
    except Exception as exc:  # jinja2 errors and the template's own raise_exception
        raise ConfigError(f"The chat template of {target.path.name} rejected the messages: {exc}") from exc


def chat_with_tools(target: Model, messages: Sequence[Mapping[str, Any]], use: Optional[ToolUse],
                    opts: GenerationOptions,
                    variables: Optional[Mapping[str, Any]] = None) -> tuple[str, GenerationOptions]:
    """The chat prompt for a reply that may use tools, and the reply's options: under ``use``, the calls'
    grammar (or under "none" the call token's ban), the tools shown to the template where they should be.
    A reasoning model's thinking is switched as ``opts.think`` asks
    (``localspec.reasoning.template.ModelReasoning.switched``); ``variables`` for the template win over that switch.

    Raises:
        ConfigError: as ``chat_text``, or ``structured.tool_use.reply_options`` (a template or vocabulary that cannot
            write calls, tools with another constraint).
    """
    shown: Sequence[Mapping[str, Any]] = ()
    if use is not None:
        opts, show = reply_options(use, opts, target)
        shown = use.offered() if show else ()
    reasoning = model_reasoning(target)
    switch: Mapping[str, Any] = {}
    if reasoning is not None:
        messages, switch = reasoning.switched(messages, opts.think)
    return chat_text(target, messages, tools=shown, variables={**switch, **(variables or {})}), opts


def infill_tokens(target: Model, prefix: str, suffix: str) -> list[int]:
    """The fill-in-the-middle prompt in the layout llama.cpp's server gives one file:
    [BOS] FIM_PRE prefix FIM_SUF suffix FIM_MID (without its repository and file-name tokens, and uncut).

    Raises:
        ConfigError: the target's vocabulary has no fill-in-the-middle tokens.
        ContextOverflowError: the two texts cannot fit the context (``check_length``).
    """
    fim = target.fim_tokens()
    if fim is None:
        raise ConfigError(f"{target.path.name} has no fill-in-the-middle tokens (such as <|fim_prefix|>), so it "
                          "cannot fill in between a prefix and a suffix; use a coder model that has them.")
    check_length(target, prefix + suffix)

    def text(s: str) -> list[int]:  # a user's text: "<|fim_suffix|>" in it is text, not the token
        return target.tokenize(s, add_special=False, parse_special=False)

    return [*([target.bos] if target.adds_bos else []), fim[0], *text(prefix), fim[1], *text(suffix), fim[2]]


def check_length(target: Model, text: str) -> None:
    """Refuse a text that cannot fit the context, before paying to tokenize all of it.

    Raises:
        ContextOverflowError: the text is longer than any tokenization of it could fit.
    """
    # No token covers more than longest_token_bytes bytes (>= characters) of text.
    if len(text) > target.longest_token_bytes * (target.n_ctx - 1):
        raise ContextOverflowError(
            f"The prompt is {len(text)} characters, which cannot fit in {target.n_ctx} tokens of context "
            f"(no token of {target.path.name} covers more than {target.longest_token_bytes} characters); "
            "shorten the prompt or raise the context length (--ctx).")
