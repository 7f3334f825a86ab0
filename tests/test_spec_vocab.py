"""Draft vocabulary compatibility (llama.cpp rules): the lesson's six cases and tokenizer.json round trips."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim.errors import ConfigError
from servesim.acceptance.vocab import Vocab, check_compatible, load_vocab

DATA = Path(__file__).parent / "data" / "vocab"
BASE = ("<s>", "</s>", "<pad>", "<x1>", "<x2>", "def", " add", "(", "a", ",", " b", "):")


def _with(i: int, text: str) -> tuple[str, ...]:
    t = list(BASE)
    t[i] = text
    return tuple(t)


def test_lesson_six_cases():
    target = Vocab("target-7b", "BPE", 0, 1, BASE)
    drafts = [
        (Vocab("same-family-0.5b", "BPE", 0, 1, BASE), "compatible"),
        (Vocab("padded-vocab", "BPE", 0, 1, BASE + ("<extra_0>",)), "compatible"),
        (Vocab("other-family", "BPE", 0, 1, _with(6, " plus")), "token 6 differs: ' add' vs ' plus'"),
        (Vocab("sentencepiece-model", "SPM", 0, 1, BASE), "vocab type differs: SPM"),
        (Vocab("different-eos", "BPE", 0, 2, BASE), "EOS id differs: 2"),
        (Vocab("special-tokens-only", "BPE", 0, 1, _with(3, "<tool>")), "compatible"),
    ]
    for draft, expected in drafts:
        assert check_compatible(target, draft, max_size_difference=2) == expected, draft.name


def test_size_bos_and_flags():
    target = Vocab("t", "BPE", 0, 1, BASE)
    bigger = Vocab("d", "BPE", 0, 1, BASE + ("x",) * 3)
    assert check_compatible(target, bigger, max_size_difference=2) == "size differs by 3"
    assert check_compatible(target, bigger) == "compatible"  # llama.cpp's 128
    assert check_compatible(target, Vocab("d", "BPE", 2, 1, BASE)) == "BOS id differs: 2"
    flagged = Vocab("t", "BPE", 0, 1, BASE, add_bos=True)
    assert check_compatible(flagged, Vocab("d", "BPE", 0, 1, BASE, add_bos=False)) == "add BOS flag differs: False"
    assert check_compatible(flagged, Vocab("d", "BPE", 0, 1, BASE)) == "compatible"  # unknown flag: not compared
    assert check_compatible(target, Vocab("d", "BPE", 0, 1, _with(4, "zz"))) == "compatible"


def test_tokenizer_json_round_trip():
    target = load_vocab(DATA / "target")
    assert target.type == "BPE" and target.bos_id == 0 and target.eos_id == 1 and target.size == 12
    assert target.add_bos is True and target.add_eos is False
    assert target.tokens[6] == "Ġadd"
    cases = {
        "draft-padded": "compatible",
        "draft-other-family": "token 6 differs: 'Ġadd' vs 'Ġplus'",
        "draft-sentencepiece": "vocab type differs: SPM",
        "draft-different-eos": "EOS id differs: 2",
        "draft-no-add-bos": "add BOS flag differs: False",
    }
    for name, expected in cases.items():
        assert check_compatible(target, load_vocab(DATA / name / "tokenizer.json"), 2) == expected, name


def test_yaml_cards():
    card = load_vocab(DATA / "card-target.yaml")
    assert card.name == "target-card" and card.tokens == load_vocab(DATA / "target").tokens
    inline = load_vocab(DATA / "card-inline.yaml")
    assert check_compatible(card, inline) == "compatible"


def test_cli_exit_codes(capsys):
    from servesim.cli import main

    assert main(["check-draft", str(DATA / "target"), str(DATA / "draft-padded")]) == 0
    assert capsys.readouterr().out.strip() == "compatible"
    assert main(["check-draft", str(DATA / "target"), str(DATA / "draft-padded"),
                 "--max-size-difference", "0"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "size differs by 1 (target 12, draft 13)"  # the lesson's wording, then both sides (it printed the draft's only)
    assert lines[1].startswith("  target (target): type BPE") and lines[1].endswith(", 12 tokens")
    assert lines[2].startswith("  draft (draft-padded): ") and lines[2].endswith(", 13 tokens") and len(lines) == 3
    assert main(["check-draft", str(DATA / "target"), str(DATA / "draft-padded"), "--check-start-id", "12"]) == 2
    assert capsys.readouterr().err == ("servesim: error: --check-start-id: 12 is beyond the vocabularies (12 and 13 "
                                       "tokens): no token text would be compared (expected below 12)\n")
    assert main(["check-draft", str(DATA / "target"), str(DATA / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "file not found" in err


def test_bad_card_is_one_line(tmp_path):
    f = tmp_path / "v.yaml"
    f.write_text("name: x\ntokens: [a, b]\n")
    with pytest.raises(ConfigError, match="vocab_type is required") as err:
        load_vocab(f)
    assert str(f) in str(err.value)


def test_default_start_id_on_a_tiny_vocabulary_still_checks_rules_1_to_6(tmp_path, capsys):
    """The check of --check-start-id refused its own default (5) on vocabularies of 5 tokens, before the
    type, BOS and EOS rules had said anything."""
    from servesim.cli import main

    card = "name: toy5\nvocab_type: BPE\nbos_id: 0\neos_id: 1\nadd_bos: true\nadd_eos: false\n" \
           'tokens: ["<s>", "</s>", "a", "b", "c"]\n'
    (tmp_path / "t.yaml").write_text(card)
    (tmp_path / "d.yaml").write_text(card.replace("BPE", "SPM"))
    assert main(["check-draft", str(tmp_path / "t.yaml"), str(tmp_path / "d.yaml")]) == 1
    assert capsys.readouterr().out.splitlines()[0] == "vocab type differs: SPM (target BPE, draft SPM)"
    assert main(["check-draft", str(tmp_path / "t.yaml"), str(tmp_path / "t.yaml")]) == 0
    assert capsys.readouterr().out.strip() == "compatible"


@pytest.mark.parametrize("tokenizer, message", [
    # each was a traceback (IndexError, ValueError, TypeError) of check-draft
    ({"model": {"type": "BPE", "vocab": {"a": -1}}},
     "model.vocab['a']: expected a token id, an integer >= 0 (got -1)"),
    ({"model": {"type": "BPE", "vocab": {"a": "x"}}},
     "model.vocab['a']: expected a token id, an integer >= 0 (got 'x')"),
    ({"model": {"type": "BPE", "vocab": {"a": None}}},
     "model.vocab['a']: expected a token id, an integer >= 0 (got None)"),
    ({"model": {"type": "Unigram", "vocab": [["a", 0.0], 5]}}, "model.vocab[1]: expected a [piece, score] pair (got 5)"),
    ({"model": {"type": "BPE", "vocab": {"a": 0}}, "added_tokens": [{"id": "z", "content": "b"}]},
     "added_tokens[0].id: expected a token id, an integer >= 0 (got 'z')"),
])
def test_a_bad_token_id_in_a_tokenizer_json_is_one_line(tmp_path, capsys, tokenizer, message):
    import json

    from servesim.cli import main

    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert main(["check-draft", str(DATA / "target"), str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"servesim: error: {tmp_path / 'tokenizer.json'}: {message}\n"


def test_a_yaml_card_s_tokenizer_may_be_a_folder(tmp_path):
    # as load_vocab's own argument and check-draft's: a model's folder holding tokenizer.json (it had read
    # "Is a directory")
    (tmp_path / "card.yaml").write_text(f"name: folder-card\ntokenizer: {DATA / 'target'}\neos_id: 3\n")
    card = load_vocab(tmp_path / "card.yaml")
    target = load_vocab(DATA / "target")
    assert card.name == "folder-card" and card.tokens == target.tokens and card.type == target.type
    assert card.eos_id == 3 and target.eos_id == 1  # the card's override
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.yaml").write_text("tokenizer: empty\n")
    with pytest.raises(ConfigError, match=r"empty/tokenizer\.json"):
        load_vocab(tmp_path / "bad.yaml")
