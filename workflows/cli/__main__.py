"""``python -m mentor.workflows.cli``: the `mentor` command."""

from mentor.workflows.cli import main

main()
