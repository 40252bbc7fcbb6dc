"""``python -m mentor.cli``: the `mentor` command."""

from mentor.cli import main

main()
