"""OpenAI's chat completions and completions: typed request bodies, replies, logprobs."""
