"""The dialogue engine: requests, the director, rollouts, the live chat session."""
