"""Prompt-lookup drafting: the lesson's rename example (Example 6), conventions, and the CLI."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from servesim.errors import TraceError
from servesim.cli import acceptance as acceptance_command
from servesim.acceptance.ngram import aggregate, propose, simulate_request
from servesim.speculation.profile import load_profile

CODE = "int sum ( int [ ] xs ) { int s = 0 ; for ( int x : xs ) s += x ; return s ; }"
PROMPT = ("Rename sum to total : " + CODE + " =>").split(" ")
ANSWER = (CODE.replace("sum", "total") + " <eos>").split(" ")
REPO = Path(__file__).resolve().parents[1]


def test_lesson_rename_example():
    rounds = simulate_request(PROMPT, ANSWER, k=8, max_n=2, min_n=2)
    assert len(ANSWER) == 30
    assert len(rounds) == 8
    assert [r.draft for r in rounds] == [
        [], [], [], [],
        ["x", ":", "xs", ")", "s", "+=", "x", ";"],
        ["]", "xs", ")", "{", "int", "s", "=", "0"],
        ["for", "(", "int", "x", ":", "xs", ")", "s"],
        ["x", ";", "return", "s", ";", "}", "=>", "int"],
    ]
    assert [r.accepted for r in rounds] == [0, 0, 0, 0, 0, 8, 8, 6]
    assert sum(len(r.draft) for r in rounds) == 32
    assert sum(r.accepted for r in rounds) == 22


def test_lesson_rename_profile():
    stats = aggregate([(PROMPT, ANSWER)], k=8, max_n=2)
    assert stats.rounds == 8 and stats.no_match_rounds == 4
    assert np.allclose(stats.per_position, [3 / 8] * 6 + [2 / 8] * 2)
    assert np.allclose(stats.per_position_given_draft, [3 / 4] * 6 + [2 / 4] * 2)
    assert stats.no_match_probability == 0.5
    assert stats.mean_acceptance_length == pytest.approx(1 + 22 / 8)
    assert stats.per_request_mean_accepted == [22 / 8]


def test_longest_ngram_first_then_shorter():
    hist = ["a", "b", "c", "x", "b", "c", "y", "q", "c"]
    # no earlier ("y", "q", "c") or ("q", "c"); the 1-gram "c" occurs at 2 and 5
    assert propose(hist, k=2, max_n=3, min_n=1) == ["y", "q"]
    assert propose(hist, k=2, max_n=3, min_n=1, prefer="earliest") == ["x", "b"]
    assert propose(hist, k=2, max_n=3, min_n=2) == []
    hist2 = ["a", "b", "c", "d", "z", "b", "c", "e", "a", "b", "c"]
    # the 3-gram "a b c" wins over the more recent 2-gram "b c"
    assert propose(hist2, k=3, max_n=3, min_n=2) == ["d", "z", "b"]
    # a match close to the end proposes fewer than k tokens
    assert propose(["p", "q", "p"], k=5, max_n=1) == ["q", "p"]


def test_token_ids_work_like_text():
    ids = {t: i for i, t in enumerate(dict.fromkeys(PROMPT + ANSWER))}
    r_ids = simulate_request([ids[t] for t in PROMPT], [ids[t] for t in ANSWER], k=8, max_n=2)
    assert [r.accepted for r in r_ids] == [0, 0, 0, 0, 0, 8, 8, 6]


def _args(**kw):
    base = {"acceptance_command": "ngram", "n": 2, "min_n": None, "k": 8, "match": "most-recent",
            "name": None, "out": None}
    base.update(kw)
    return argparse.Namespace(**base)


def test_cli_writes_a_profile_the_engine_reads(tmp_path, capsys):
    inp = tmp_path / "pairs.jsonl"
    inp.write_text(json.dumps({"prompt": " ".join(PROMPT), "answer": " ".join(ANSWER)}) + "\n")
    out = tmp_path / "rename.yaml"
    assert acceptance_command.run(_args(input=inp, out=out)) == 0
    assert "drafted: 32 tokens, accepted: 22 tokens" in capsys.readouterr().out
    prof = load_profile(str(out))
    assert prof.method == "ngram" and prof.name == "rename"
    assert prof.no_match_probability == 0.5
    assert np.allclose(prof.unconditional(), [3 / 8] * 6 + [2 / 8] * 2)
    assert prof.mean_acceptance_length() == pytest.approx(1 + 22 / 8)


def test_cli_through_servesim_main(tmp_path):
    from servesim.cli import main

    out = tmp_path / "ex.yaml"
    example = REPO / "workloads" / "examples" / "ngram-pairs.jsonl"
    assert main(["acceptance", "ngram", "--input", str(example), "--n", "3", "--min-n", "2", "--k", "4",
                 "--out", str(out)]) == 0
    prof = load_profile(str(out))
    assert prof.num_positions == 4 and 0 < prof.no_match_probability < 1


@pytest.mark.parametrize("k", [0, 129])
def test_cli_refuses_a_k_no_speculative_config_takes(tmp_path, capsys, k):
    """--k 200 wrote a 200-position profile that every speculative_config refuses (at most 128)."""
    from servesim.cli import main

    example = REPO / "workloads" / "examples" / "ngram-pairs.jsonl"
    out = tmp_path / "p.yaml"
    assert main(["acceptance", "ngram", "--input", str(example), "--k", str(k), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"servesim: error: --k: expected num_speculative_tokens from 1 to 128, the "
                                       f"most servesim takes (got {k})\n")
    assert not out.exists()
    assert main(["acceptance", "ngram", "--input", str(example), "--k", "128", "--out", str(out)]) == 0


@pytest.mark.parametrize(("line", "expect"), [
    ("{not json", "line 1: invalid JSON"),
    ('{"prompt": "a b"}', "line 1: answer: expected"),
    ('{"prompt": 3, "answer": "a"}', "line 1: prompt: expected"),
])
def test_bad_jsonl_is_one_line_error(tmp_path, line, expect):
    inp = tmp_path / "bad.jsonl"
    inp.write_text(line + "\n")
    with pytest.raises(TraceError, match=expect) as err:
        acceptance_command.read_pairs(inp)
    assert "\n" not in str(err.value) and str(inp) in str(err.value)
