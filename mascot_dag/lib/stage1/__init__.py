"""Stage 1, persona alignment: preference pairs, rewards, the persona probe, group-aware prompts."""
