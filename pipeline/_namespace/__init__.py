"""mentor: collapsed GRPO problems -> answer-free hints -> next-epoch prompts."""

__version__ = "0.1.0"

from mentor.pipeline.plugins import install_finder as _install_plugin_finder

_install_plugin_finder()  # plugins (MENTOR_PLUGIN_PATH) import as mentor.plugins.<point>.<name> in every process
