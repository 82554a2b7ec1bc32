"""Who-is-the-spy template: a multi-agent social deduction word game played by LLM agents."""
