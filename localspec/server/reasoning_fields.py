"""A chat request's reasoning fields: OpenAI's ``reasoning_effort`` and the template variables of
``chat_template_kwargs`` (llama-server's and vLLM's field), as generation options and template variables."""

from __future__ import annotations

from typing import Any, Optional

from ..errors import LocalspecError
from ..options import GenerationOptions
from ..reasoning.formats import THINK_VARIABLE
from .http import ApiError

#: OpenAI's reasoning efforts; "none" turns thinking off, the rest leave it on.
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
#: The efforts a template's ``reasoning_effort`` variable takes (GPT-OSS's).
TEMPLATE_EFFORTS = ("low", "medium", "high")


def reasoning_fields(effort: Optional[str], kwargs: Optional[dict[str, Any]],
                     options: GenerationOptions) -> tuple[GenerationOptions, Optional[dict[str, Any]]]:
    """The options (``think``) and template variables a request's reasoning fields ask for.

    Raises:
        ApiError: an effort OpenAI does not name, or an ``enable_thinking`` that is not true or false.
    """
    variables: dict[str, Any] = {}
    think = options.think
    if effort is not None:
        if effort not in EFFORTS:
            raise ApiError(400, f"'reasoning_effort' must be one of {', '.join(EFFORTS)}, got {effort!r}.",
                           param="reasoning_effort", code="invalid_value")
        think = effort != "none"
        if effort in TEMPLATE_EFFORTS:
            variables["reasoning_effort"] = effort
    if kwargs:
        switch = kwargs.get(THINK_VARIABLE)
        if switch is not None and not isinstance(switch, bool):
            raise ApiError(400, f"chat_template_kwargs.{THINK_VARIABLE} must be true or false, got {switch!r}.",
                           param="chat_template_kwargs", code="invalid_value")
        think = switch if switch is not None else think
        variables.update(kwargs)
    try:
        options = options.replace(think=think) if think != options.think else options
    except LocalspecError as exc:
        raise ApiError(400, str(exc), param="reasoning_effort", code="invalid_value") from None
    return options, variables or None
