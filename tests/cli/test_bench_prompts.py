"""`specdec bench`'s prompts: the built-in editing set and `--prompt-file` parsing."""

import ast
import json

import pytest

from specdec.cli.bench import EDITING_PROMPTS, load_prompts


def test_plain_text_one_prompt_per_line(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("first prompt\n\n   \nFix this:\\n\\ndef f():\\n    return '\\\\n'\r\nlast\n")
    assert load_prompts(path) == {
        "custom": ["first prompt", "Fix this:\n\ndef f():\n    return '\\n'", "last"]}


def test_jsonl_sets_in_order_of_appearance(tmp_path):
    path = tmp_path / "prompts.jsonl"
    lines = [{"prompt": "a\nb", "set": "edit"}, {"prompt": "c"}, {"prompt": "d", "set": "edit"}]
    path.write_text("\n".join(json.dumps(x) for x in lines[:2]) + "\n\n" + json.dumps(lines[2]) + "\n")
    sets = load_prompts(path)
    assert sets == {"edit": ["a\nb", "d"], "custom": ["c"]}
    assert list(sets) == ["edit", "custom"]


@pytest.mark.parametrize("name", ["empty.txt", "empty.jsonl"])
def test_a_file_without_prompts_is_an_error(tmp_path, name):
    path = tmp_path / name
    path.write_text("\n  \n")
    with pytest.raises(ValueError, match="no prompts"):
        load_prompts(path)


@pytest.mark.parametrize("bad, message", [
    ('{"prompt": "unterminated', "not valid JSON"),
    ('["a list"]', "expected an object"),
    ('{"set": "edit"}', '"prompt" must be'),
    ('{"prompt": ""}', '"prompt" must be'),
    ('{"prompt": "x", "set": 3}', '"set" must be'),
])
def test_a_bad_jsonl_line_names_its_line_number(tmp_path, bad, message):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "fine"}\n\n' + bad + "\n")
    with pytest.raises(ValueError, match=rf"prompts\.jsonl:3: {message}"):
        load_prompts(path)


def test_the_editing_prompts_edit_four_different_functions():
    names = []
    for prompt in EDITING_PROMPTS:
        source = prompt.split("\n\n", 1)[1]
        (function,) = ast.parse(source).body
        assert isinstance(function, ast.FunctionDef)
        assert 15 <= len(source.splitlines()) <= 25
        names.append(function.name)
    assert len(set(names)) == len(EDITING_PROMPTS) == 4
