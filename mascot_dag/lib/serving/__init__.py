"""The OpenAI-compatible HTTP app of `mascot serve` and its request protocol."""
