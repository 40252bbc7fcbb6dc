"""The prompt layout every stage shares: how a (hinted) problem becomes the user message.

`mentor build` writes it into the next round's prompts, `mentor rollout` /
`mentor rescue` sample with it, and `mentor ingest` strips it again to recover
the original problem from a logged prompt. One definition, so the three stay in step.
"""

from __future__ import annotations

# User message of a hinted problem: placeholders {hint}, {problem} (build also accepts {instruction}).
HINT_TEMPLATE = "Hint: {hint}\n\n{problem}"
# Appended to the user message (after a blank line), per domain.
INSTRUCTIONS = {
    "math": "Please reason step by step, and put your final answer within \\boxed{}.",
    "code": "Write the complete solution in Python inside one ```python code block.",
}

__all__ = ["HINT_TEMPLATE", "INSTRUCTIONS"]
