"""mentor: collapsed GRPO problems -> answer-free hints -> next-epoch prompts."""

__version__ = "0.1.0"
