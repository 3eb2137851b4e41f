"""Stage 2, the director: its group reward and the director comparison."""
