"""Prompt templates (jinja2, StrictUndefined): bundled rendering, user overrides, and one-line errors."""

from __future__ import annotations

import pickle

import pytest

from mentor.pipeline.errors import ConfigError
from mentor.stages.hint.agents import TEMPLATE_DIR, TEMPLATE_VARS, Templates


def test_bundled_templates_render_values_verbatim_and_keep_their_text():
    t = Templates.load()
    for name, allowed in TEMPLATE_VARS.items():
        source = (TEMPLATE_DIR / f"{name}.txt").read_text(encoding="utf-8")
        if not allowed:  # system prompts and generic fallbacks are used as they are
            assert t.texts[name] == source and t.render(name) == source
    # values are inserted as they are: braces, jinja syntax, backslashes, the trailing newline kept
    value = '{"a": {"b": 1}} {{x}} {% if y %} \\ é'
    out = t.render("judgment_user", problem=value, answer="42", solution="", hint="h")
    src = (TEMPLATE_DIR / "judgment_user.txt").read_text(encoding="utf-8")
    block = src[src.index("{% if solution %}"):src.index("{% endif %}") + len("{% endif %}")]
    assert out == src.replace(block, "").replace("{{problem}}", value).replace("{{answer}}", "42").replace("{{hint}}", "h")
    assert out.endswith("\n") and '{"check": "...", "correct": true or false' in t.texts["judgment_system"]
    # with a reference solution, the block shows it as it is
    shown = t.render("judgment_user", problem="p", answer="42", solution=value, hint="h")
    assert f"Reference solution (check every claim and number of the hint against it):\n{value}\n" in shown


def test_user_override_with_literal_braces(tmp_path):
    (tmp_path / "judgment_user.txt").write_text('P: {{ problem }}\nReply {"score": 1, "x": {"y": 2}}\n{% raw %}{{hint}}{% endraw %} {{hint}}')
    (tmp_path / "generation_system.txt").write_text('JSON {"hint": "..."}}{')
    t = Templates.load(tmp_path)
    assert t.render("judgment_user", problem="p", answer="a", hint="h") == 'P: p\nReply {"score": 1, "x": {"y": 2}}\n{{hint}} h'
    assert t.texts["generation_system"] == 'JSON {"hint": "..."}}{'
    assert t.texts["repair_system"] == Templates.load().texts["repair_system"]
    assert t.sources["judgment_user"] == str(tmp_path / "judgment_user.txt")
    again = pickle.loads(pickle.dumps(t))  # dask ships it to workers
    assert again.version == t.version and again.render("judgment_user", problem="p", answer="a", hint="h").startswith("P: p")


@pytest.mark.parametrize("text, pattern", [
    ("{{problem}} {{secret}}", r"judgment_user\.txt: unknown placeholder\(s\) \['secret'\]; judgment_user may use \['answer', 'hint', 'problem', 'solution'\]"),
    ("{{problem}\n{{hint}}", r"judgment_user\.txt: line 1: .*; fix the jinja2 syntax .*\{% raw %\}"),
    ("{% if hint %}x", r"judgment_user\.txt: line 1: .*endif.*; fix the jinja2 syntax"),
    ("{{ problem.nope }}", r"judgment_user\.txt: .*has no attribute 'nope'; judgment_user may use"),
    ("{{ problem + 1 }}", r"judgment_user\.txt: .*judgment_user may use .*, each a string"),
    ("{{ problem.__class__.__mro__ }}", r"judgment_user\.txt: .*unsafe"),
])
def test_a_bad_user_template_is_one_line_naming_the_file_and_the_fix(tmp_path, text, pattern):
    (tmp_path / "judgment_user.txt").write_text(text)
    with pytest.raises(ConfigError, match=pattern) as info:
        Templates.load(tmp_path)
    assert "\n" not in str(info.value)


def test_a_value_the_template_uses_but_was_not_given_is_an_error():
    t = Templates.load()
    with pytest.raises(ConfigError, match=r"judgment_user\.txt: 'hint' is undefined"):
        t.render("judgment_user", problem="p", answer="a", solution="")


def test_a_user_template_that_is_not_utf8(tmp_path):
    (tmp_path / "judgment_user.txt").write_bytes(b"{{problem}} caf\xe9")
    with pytest.raises(ConfigError, match=r"judgment_user\.txt: not UTF-8 text .*; save it as UTF-8"):
        Templates.load(tmp_path)
