"""The prompt layout every stage shares: how a (hinted) problem becomes the user message.

`mentor build` writes it into the next round's prompts (with polars expressions that
follow `user_message`), `mentor rollout` / `mentor rescue` sample with `user_message`
itself, and `mentor ingest` strips it again to recover the original problem from a
logged prompt. One definition, so the three stay in step.
"""

from __future__ import annotations

import re

# User message of a hinted problem: placeholders {hint}, {problem}, optional {instruction}.
HINT_TEMPLATE = "Hint: {hint}\n\n{problem}"
PLAIN_TEMPLATE = "{problem}"
# What starts mentor's hint block (ingest looks for it in logged prompts).
HINT_PREFIX = HINT_TEMPLATE.split("{hint}")[0].strip()
# Appended to the user message per domain, after INSTRUCTION_SEPARATOR, unless the template places {instruction}.
INSTRUCTIONS = {
    "math": "Please reason step by step, and put your final answer within \\boxed{}.",
    "code": "Write the complete solution in Python inside one ```python code block.",
}
INSTRUCTION_SEPARATOR = "\n\n"
PLACEHOLDER_RE = re.compile(r"\{(hint|problem|instruction)\}")


def user_message(problem: str, instruction: str = "", hint: str | None = None, template: str = HINT_TEMPLATE,
                 plain_template: str = PLAIN_TEMPLATE) -> str:
    """The user message: `template` when there is a hint, else `plain_template`, filled in.

    Only {hint}, {problem} and {instruction} are placeholders (other braces, e.g. LaTeX,
    stay as they are); a template without {instruction} gets a non-empty instruction
    after INSTRUCTION_SEPARATOR.
    """
    text = template if hint is not None else plain_template
    values = {"hint": hint or "", "problem": problem, "instruction": instruction}
    body = PLACEHOLDER_RE.sub(lambda m: values[m.group(1)], text)
    if "{instruction}" not in text and instruction:
        body += INSTRUCTION_SEPARATOR + instruction
    return body


__all__ = ["HINT_PREFIX", "HINT_TEMPLATE", "INSTRUCTIONS", "INSTRUCTION_SEPARATOR", "PLACEHOLDER_RE", "PLAIN_TEMPLATE",
           "user_message"]
