"""OpenAI's Responses API: request bodies translated into the server's request type, and its replies."""
