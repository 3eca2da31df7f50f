"""Chat fixtures shared by the structured-output, reasoning and server tests: tool schemas and a reasoning
template."""

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["utc", "cet", "pst"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function",
          "function": {"name": "get_weather", "description": "The forecast", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
TOOL_MESSAGES = [{"role": "user", "content": "in the end, in the end, what is the weather in the end"}]

THINK_TOKENS = ["<think>", "</think>"]
# A template that opens the reasoning in the prompt (as DeepSeek-R1's does) unless enable_thinking is false,
# and drops an earlier answer's reasoning.
OPENS = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{{ m['content'].split('</think>')[-1] | trim }}"
    "{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}"
)
THINKING_METHODS = [("lookup", 3), ("draft", 2), ("draft", 6), ("auto", None)]
HARMONY_TOKENS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>"]
