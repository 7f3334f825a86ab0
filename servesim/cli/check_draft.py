"""``servesim check-draft TARGET DRAFT``: llama.cpp's draft/target vocabulary compatibility check.

TARGET and DRAFT are ``tokenizer.json`` files, directories holding one (with ``tokenizer_config.json``), or
YAML vocabulary cards (:class:`servesim.acceptance.vocab.VocabCard`). Prints ``compatible`` (exit 0) or
the first failing rule (exit 1); unreadable inputs are errors (exit 2).
"""

from __future__ import annotations

import argparse

from servesim.errors import ConfigError
from servesim.acceptance.vocab import (
    SPEC_VOCAB_CHECK_START_TOKEN_ID,
    SPEC_VOCAB_MAX_SIZE_DIFFERENCE,
    first_difference,
    load_vocab,
)

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``check-draft`` arguments to ``parser``."""
    parser.add_argument("target", help="target tokenizer.json, its directory, or a vocabulary YAML")
    parser.add_argument("draft", help="draft tokenizer.json, its directory, or a vocabulary YAML")
    parser.add_argument("--max-size-difference", type=int, default=SPEC_VOCAB_MAX_SIZE_DIFFERENCE,
                        help=f"largest allowed vocabulary size difference (default {SPEC_VOCAB_MAX_SIZE_DIFFERENCE})")
    parser.add_argument("--check-start-id", type=int, default=None,
                        help=f"first token id whose text is compared (default {SPEC_VOCAB_CHECK_START_TOKEN_ID})")


def run(args: argparse.Namespace) -> int:
    """Print ``compatible`` and return 0, or print the first failing rule (the lesson's wording, then the
    target's and the draft's value it compares) and both vocabularies' fields and return 1.

    Raises:
        ConfigError: a negative option, or a ``--check-start-id`` given at or beyond the smaller vocabulary
            (rule 7 would compare no token) when rules 1-6 pass.
    """
    if args.max_size_difference < 0:
        raise ConfigError(f"--max-size-difference: expected >= 0 (got {args.max_size_difference})")
    if args.check_start_id is not None and args.check_start_id < 0:
        raise ConfigError(f"--check-start-id: expected >= 0 (got {args.check_start_id})")
    target, draft = load_vocab(args.target), load_vocab(args.draft)
    start = SPEC_VOCAB_CHECK_START_TOKEN_ID if args.check_start_id is None else args.check_start_id
    verdict, field = first_difference(target, draft, args.max_size_difference, start)
    smaller = min(target.size, draft.size)
    if verdict == "compatible" and args.check_start_id is not None and start >= smaller:
        # rules 1-6 passed, and the start the user gave left rule 7 no token to compare
        raise ConfigError(f"--check-start-id: {start} is beyond the vocabularies ({target.size} and "
                          f"{draft.size} tokens): no token text would be compared (expected below {smaller})")
    if verdict == "compatible":
        print(verdict)
        return 0
    # the lesson's (llama.cpp's) wording names the draft's value only ("BOS id differs: None"): both follow
    both = f" (target {_shown(getattr(target, field))}, draft {_shown(getattr(draft, field))})" if field else ""
    print(verdict + both)
    for role, vocab in (("target", target), ("draft", draft)):  # every field of both sides
        print(f"  {role} ({vocab.name}): type {vocab.type}, BOS id {_shown(vocab.bos_id)}, EOS id "
              f"{_shown(vocab.eos_id)}, add BOS {_shown(vocab.add_bos, 'unknown')}, add EOS "
              f"{_shown(vocab.add_eos, 'unknown')}, {vocab.size} tokens")
    return 1


def _shown(value, missing: str = "none") -> str:
    """A vocabulary field as printed: ``missing`` for None (no BOS token; a flag not given)."""
    return missing if value is None else str(value)
