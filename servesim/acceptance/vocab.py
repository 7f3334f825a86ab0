"""Draft/target vocabulary compatibility, as llama.cpp's ``common_speculative_are_compatible``
(``common/speculative.cpp``; lesson, Example 7).

Rules, checked in this order; the first that fails is reported in the lesson's wording:

1. vocabulary types equal                         -> ``vocab type differs: SPM``
2. add-BOS flags equal (when both are known)      -> ``add BOS flag differs: False``
3. BOS ids equal                                  -> ``BOS id differs: 2``
4. add-EOS flags equal (when both are known)      -> ``add EOS flag differs: True``
5. EOS ids equal                                  -> ``EOS id differs: 2``
6. sizes differ by at most ``max_size_difference`` (llama.cpp ``SPEC_VOCAB_MAX_SIZE_DIFFERENCE`` = 128)
                                                  -> ``size differs by 130``
7. token texts equal from id ``check_start_id`` (``SPEC_VOCAB_CHECK_START_TOKEN_ID`` = 5) up to the smaller
   size                                           -> ``token 6 differs: ' add' vs ' plus'``

Otherwise ``compatible``. llama.cpp logs a warning and runs without speculation when a rule fails.

Inputs: a Hugging Face ``tokenizer.json`` (with an optional ``tokenizer_config.json`` beside it for the
BOS/EOS tokens and ``add_bos_token``/``add_eos_token``), a directory holding them, or a YAML vocabulary
card (:class:`VocabCard`, also accepted under a ``vocab:`` key of a model card). The vocabulary type of a
``tokenizer.json`` is mapped to llama.cpp's names: ``BPE`` with ``byte_fallback`` -> ``SPM`` (a
SentencePiece model exported as BPE, e.g. Llama 2), ``BPE`` -> ``BPE``, ``Unigram`` -> ``UGM``,
``WordPiece`` -> ``WPM``; other types keep their name. This mapping is servesim's heuristic.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from servesim.input_models import InputModel
from servesim.input_files import load_yaml, validate
from servesim.errors import ConfigError

__all__ = [
    "SPEC_VOCAB_MAX_SIZE_DIFFERENCE",
    "SPEC_VOCAB_CHECK_START_TOKEN_ID",
    "Vocab",
    "VocabCard",
    "check_compatible",
    "first_difference",
    "load_vocab",
]

SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128
SPEC_VOCAB_CHECK_START_TOKEN_ID = 5
_HF_TYPES = {"BPE": "BPE", "Unigram": "UGM", "WordPiece": "WPM"}


@dataclass(frozen=True)
class Vocab:
    """A vocabulary as the compatibility check sees it.

    Attributes:
        name: label for messages. type: llama.cpp vocabulary type (``SPM``, ``BPE``, ``WPM``, ``UGM``...).
        bos_id, eos_id: special token ids (None = none). add_bos, add_eos: flags (None = unknown).
        tokens: token text by id (``None`` for an unused id); ``size = len(tokens)``.
    """

    name: str
    type: str
    bos_id: int | None
    eos_id: int | None
    tokens: tuple[str | None, ...]
    add_bos: bool | None = None
    add_eos: bool | None = None

    @property
    def size(self) -> int:
        return len(self.tokens)


#: Rules 1-5: the field each compares and its name in the lesson's wording (a flag only when both are known)
_FIELD_RULES = (("type", "vocab type"), ("add_bos", "add BOS flag"), ("bos_id", "BOS id"),
                ("add_eos", "add EOS flag"), ("eos_id", "EOS id"))


def check_compatible(target: Vocab, draft: Vocab, max_size_difference: int = SPEC_VOCAB_MAX_SIZE_DIFFERENCE,
                     check_start_id: int = SPEC_VOCAB_CHECK_START_TOKEN_ID) -> str:
    """``"compatible"`` or the first failing rule's message (see the module docstring)."""
    return first_difference(target, draft, max_size_difference, check_start_id)[0]


def first_difference(target: Vocab, draft: Vocab, max_size_difference: int = SPEC_VOCAB_MAX_SIZE_DIFFERENCE,
                     check_start_id: int = SPEC_VOCAB_CHECK_START_TOKEN_ID) -> tuple[str, str | None]:
    """The first failing rule's message (``"compatible"`` if none fails) and the :class:`Vocab` attribute it
    compares (``type``, ``add_bos``, ``bos_id``, ``add_eos``, ``eos_id`` or ``size``; None for a token text,
    whose message shows both, and for ``compatible``)."""
    for field, label in _FIELD_RULES:
        mine, theirs = getattr(target, field), getattr(draft, field)
        if field.startswith("add_") and (mine is None or theirs is None):
            continue  # a flag is compared only when both vocabularies give it
        if mine != theirs:
            return f"{label} differs: {theirs}", field
    diff = abs(target.size - draft.size)
    if diff > max_size_difference:
        return f"size differs by {diff}", "size"
    for i in range(check_start_id, min(target.size, draft.size)):
        if target.tokens[i] != draft.tokens[i]:
            return f"token {i} differs: '{target.tokens[i]}' vs '{draft.tokens[i]}'", None
    return "compatible", None


class VocabCard(InputModel):
    """A vocabulary described in YAML: ``tokens`` inline, or ``tokenizer`` (a tokenizer.json path, or a folder
    holding one, relative to the YAML file) with optional overrides of the other fields."""

    model_config = ConfigDict(extra="forbid")
    name: str | None = None
    vocab_type: str | None = None
    bos_id: int | None = Field(default=None, ge=0)
    eos_id: int | None = Field(default=None, ge=0)
    add_bos: bool | None = None
    add_eos: bool | None = None
    tokens: list[str | None] | None = None
    tokenizer: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> VocabCard:
        if (self.tokens is None) == (self.tokenizer is None):
            raise ValueError("give exactly one of tokens and tokenizer")
        if self.tokens is not None and self.vocab_type is None:
            raise ValueError("vocab_type is required with inline tokens")
        return self


def _special_id(value: Any, table: dict[str, int]) -> int | None:
    if isinstance(value, dict):
        value = value.get("content")
    if isinstance(value, str):
        return table.get(value)
    return None


def _read_json(path: Path) -> Any:
    from servesim.input_files import not_utf8_message, parse_json

    try:
        text = path.read_text(encoding="utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise ConfigError(not_utf8_message(path, exc)) from None
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read file ({exc.strerror})") from None
    try:
        return parse_json(text, str(path))  # a key given twice, too deep, an over-long integer: one line
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: line {exc.lineno}: invalid JSON ({exc.msg})") from None


def _token_id(value: Any, path: Path, field: str) -> int:
    """A token id of a tokenizer.json, an integer >= 0 (a string, null or negative id was a traceback)."""
    if type(value) is not int or value < 0:
        raise ConfigError(f"{path}: {field}: expected a token id, an integer >= 0 (got {value!r})")
    return value


def _from_tokenizer_json(path: Path, name: str | None = None) -> Vocab:
    data = _read_json(path)
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, dict) or "type" not in model or "vocab" not in model:
        raise ConfigError(f"{path}: model: expected a Hugging Face tokenizer.json with model.type and model.vocab")
    raw = model["vocab"]
    table: dict[str, int] = {}
    if isinstance(raw, dict):
        table = {str(k): _token_id(v, path, f"model.vocab[{k!r}]") for k, v in raw.items()}
    elif isinstance(raw, list):  # Unigram: [[piece, score], ...]
        for i, entry in enumerate(raw):
            if not isinstance(entry, list) or not entry:
                raise ConfigError(f"{path}: model.vocab[{i}]: expected a [piece, score] pair (got {entry!r})")
            table[str(entry[0])] = i
    else:
        raise ConfigError(f"{path}: model.vocab: expected a mapping or a list")
    for n, tok in enumerate(data.get("added_tokens") or []):
        if isinstance(tok, dict) and "id" in tok and "content" in tok:
            table[str(tok["content"])] = _token_id(tok["id"], path, f"added_tokens[{n}].id")
    size = max(table.values()) + 1 if table else 0
    texts: list[str | None] = [None] * size
    for text, i in table.items():
        texts[i] = text
    vtype = str(model["type"])
    vtype = "SPM" if vtype == "BPE" and model.get("byte_fallback") else _HF_TYPES.get(vtype, vtype)
    bos = eos = None
    add_bos = add_eos = None
    cfg_path = path.with_name("tokenizer_config.json")
    if cfg_path.is_file():
        cfg = _read_json(cfg_path)
        if isinstance(cfg, dict):
            bos, eos = _special_id(cfg.get("bos_token"), table), _special_id(cfg.get("eos_token"), table)
            add_bos = cfg.get("add_bos_token") if isinstance(cfg.get("add_bos_token"), bool) else None
            add_eos = cfg.get("add_eos_token") if isinstance(cfg.get("add_eos_token"), bool) else None
    return Vocab(name=name or path.parent.name, type=vtype, bos_id=bos, eos_id=eos, tokens=tuple(texts),
                 add_bos=add_bos, add_eos=add_eos)


def load_vocab(spec: str | Path) -> Vocab:
    """Load a vocabulary from a ``tokenizer.json``, a directory holding one, or a YAML vocabulary card.

    Raises:
        ConfigError: missing file, unreadable JSON/YAML, or a card that does not validate (one line).
    """
    path = Path(spec)
    if path.is_dir():
        path = path / "tokenizer.json"
    if path.suffix in (".yaml", ".yml"):
        data = load_yaml(path)
        if isinstance(data, dict) and isinstance(data.get("vocab"), dict):
            data = data["vocab"]
        card = validate(VocabCard, data, str(path))
        name = card.name or path.stem
        if card.tokenizer is not None:
            tokenizer = path.parent / card.tokenizer
            if tokenizer.is_dir():  # a model's folder, as load_vocab's own argument may be
                tokenizer = tokenizer / "tokenizer.json"
            base = _from_tokenizer_json(tokenizer, name)
            return Vocab(
                name=name, type=card.vocab_type or base.type,
                bos_id=card.bos_id if card.bos_id is not None else base.bos_id,
                eos_id=card.eos_id if card.eos_id is not None else base.eos_id,
                tokens=base.tokens,
                add_bos=card.add_bos if card.add_bos is not None else base.add_bos,
                add_eos=card.add_eos if card.add_eos is not None else base.add_eos,
            )
        assert card.tokens is not None and card.vocab_type is not None
        return Vocab(name=name, type=card.vocab_type, bos_id=card.bos_id, eos_id=card.eos_id,
                     tokens=tuple(card.tokens), add_bos=card.add_bos, add_eos=card.add_eos)
    return _from_tokenizer_json(path)
