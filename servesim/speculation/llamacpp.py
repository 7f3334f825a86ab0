"""llama.cpp server speculative flags as a servesim ``speculative_config`` (seed lesson, Example 10).

llama.cpp (pinned commit 0c1e57098, ``common/arg.cpp``) configures speculation with command-line flags
instead of vLLM's JSON. :func:`parse_llamacpp_flags` maps them onto the same engine:

==================================  ===========================================================
llama.cpp flag                      servesim ``speculative_config``
==================================  ===========================================================
``--spec-type none`` (default)      no speculation (returns ``None``)
``--spec-type draft-simple``        ``method: draft_model``, ``model`` from ``-md``
``--spec-type draft-eagle3``        ``method: eagle3`` (``-md`` kept as the model's label)
``--spec-type draft-mtp``           ``method: mtp``
``--spec-type ngram-*``             ``method: ngram``, ``prompt_lookup_min = prompt_lookup_max = size-n``,
                                    ``num_speculative_tokens = size-m``
``--spec-draft-n-max N``            ``num_speculative_tokens`` of the draft types (default 3)
``-md`` / ``--spec-draft-model``    the draft model: a servesim model card name or path; a ``.gguf`` file
                                    needs ``--spec-model-card NAME`` (servesim cannot read GGUF)
``--spec-ngram-simple-size-n N``    n-gram length to look up (default 12)
``--spec-ngram-simple-size-m M``    tokens drafted after a match (default 48)
``--temp T``                        ``temperature`` (servesim's default 0 = greedy when not given;
                                    llama.cpp's own sampling default is 0.8, usually set per request)
==================================  ===========================================================

servesim's extensions (no llama.cpp equivalent): ``--spec-model-card NAME`` (the model card of a GGUF
draft) and ``--spec-acceptance PROFILE`` (the ``acceptance`` key: a profile name, a path, or a number =
``{alpha: x}``). Every mapping sets ``verification_rule: match`` (llama.cpp's server samples the target and
accepts a draft token only when the sample equals it, ``common_sampler_sample_and_accept_n``) and
``draft_budget_limit: true`` (a draft never exceeds the remaining output budget minus one token,
``get_n_draft_max`` in ``tools/server/server-context.cpp``; :func:`draft_budget`).

The other n-gram types (``ngram-map-k``, ``ngram-map-k4v``, ``ngram-mod``, ``ngram-cache``) have their own
matching rules; servesim approximates them by vLLM-style prompt lookup with the ``ngram-simple`` sizes.
``draft-dflash`` and ``draft-dspark`` have no servesim drafter cost model: a ConfigError says so.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from servesim.errors import ConfigError

__all__ = [
    "SPEC_TYPES",
    "DEFAULT_SPEC_TYPE",
    "DEFAULT_DRAFT_N_MAX",
    "DEFAULT_NGRAM_SIZE_N",
    "DEFAULT_NGRAM_SIZE_M",
    "parse_llamacpp_flags",
    "draft_budget",
    "LlamaCppRound",
    "replay_request",
    "mean_acceptance_length",
]

SPEC_TYPES: tuple[str, ...] = (
    "none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark",
    "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
)
"""``--spec-type`` values listed by llama.cpp's help at the pinned commit (seed lesson, Example 10)."""

DEFAULT_SPEC_TYPE = "none"
DEFAULT_DRAFT_N_MAX = 3
DEFAULT_NGRAM_SIZE_N = 12
DEFAULT_NGRAM_SIZE_M = 48

_METHODS = {"draft-simple": "draft_model", "draft-eagle3": "eagle3", "draft-mtp": "mtp"}

# flag spelling -> canonical name
_FLAGS = {
    "--spec-type": "spec_type",
    "--spec-draft-n-max": "n_max",
    "-md": "draft_model",
    "--spec-draft-model": "draft_model",
    "--model-draft": "draft_model",
    "--spec-ngram-simple-size-n": "size_n",
    "--spec-ngram-simple-size-m": "size_m",
    "--temp": "temperature",
    "--temperature": "temperature",
    "--spec-model-card": "model_card",
    "--spec-acceptance": "acceptance",
}


#: The keys of :data:`_FLAGS` that every ``--spec-type`` reads, none included.
_APPLIES_TO = {"common": frozenset({"spec_type", "temperature"})}
#: A ``--spec-type`` that reads a key (for the error naming a flag the default type ignores).
_TYPE_FOR_FLAG = {"size_n": "ngram-simple", "size_m": "ngram-simple", "n_max": "draft-simple",
                  "draft_model": "draft-simple", "model_card": "draft-simple", "acceptance": "draft-simple"}


#: An integer or a decimal number as written on a command line: ASCII digits only (Python's ``int`` and
#: ``float`` also take ``1_0``, non-ASCII digits, ``nan`` and ``inf``, which llama.cpp's ``std::stoi`` and
#: ``std::stof`` read differently or not at all).
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
#: More digits than this are refused as not an integer (``int`` refuses over 4,300 digits,
#: ``sys.get_int_max_str_digits``, with a ValueError that would surface as a traceback).
_MAX_DIGITS = 100


def _int(value: str, flag: str, source: str, minimum: int = 1) -> int:
    if not _INTEGER.fullmatch(value) or len(value.lstrip("+-")) > _MAX_DIGITS:
        shown = value if len(value) <= 40 else f"{value[:20]}...({len(value)} characters)"
        raise ConfigError(f"{source}: {flag}: expected an integer >= {minimum} (got {shown!r})")
    n = int(value)
    if n < minimum:
        raise ConfigError(f"{source}: {flag}: expected an integer >= {minimum} (got {n})")
    return n


def _split(flags: str | Sequence[str], source: str) -> dict[str, tuple[str, str]]:
    """Canonical name -> (flag as written, value); later flags win, as in llama.cpp."""
    if isinstance(flags, str):
        try:
            words = shlex.split(flags)
        except ValueError as exc:
            raise ConfigError(f"{source}: cannot split the flags ({exc})") from None
    else:
        words = list(flags)
    found: dict[str, tuple[str, str]] = {}
    i = 0
    while i < len(words):
        word = words[i]
        flag, eq, value = word.partition("=") if word.startswith("--") else (word, "", "")
        if flag not in _FLAGS:
            known = ", ".join(sorted(set(_FLAGS)))
            raise ConfigError(f"{source}: unknown or unsupported flag {flag!r} (expected one of: {known})")
        if not eq:
            if i + 1 >= len(words):
                raise ConfigError(f"{source}: {flag} needs a value")
            i += 1
            value = words[i]
        found[_FLAGS[flag]] = (flag, value)
        i += 1
    return found


def parse_llamacpp_flags(flags: str | Sequence[str], source: str = "--llama-cpp-spec") -> dict[str, Any] | None:
    """Map a llama.cpp server's speculative flags onto a servesim ``speculative_config`` mapping.

    Args:
        flags: the flags as one shell-quoted string (``"--spec-type draft-simple -md tiny.gguf
            --spec-model-card qwen3-0.6b --spec-draft-n-max 4"``) or a list of words; ``--flag=value`` works.
        source: what to name in errors.

    Returns:
        A mapping for :class:`~servesim.speculation.config.SpeculativeConfig` (not yet validated, so that
        ``--set speculative_config.KEY=...`` may complete it), or ``None`` for ``--spec-type none``.

    Raises:
        ConfigError: no flags, an unknown flag (named), a missing or malformed value, an unknown ``--spec-type``, a
            type servesim cannot simulate, ``draft-simple`` without a draft model, a GGUF draft without
            ``--spec-model-card``, speculative flags without ``--spec-type`` (llama.cpp's default type, none,
            would ignore them; one line each). Flags of another type beside an explicit ``--spec-type`` are
            ignored, as llama.cpp ignores them.
    """
    f = _split(flags, source)
    if not f:  # as an empty --set value: usually a shell variable that was not set
        raise ConfigError(f"{source}: no flags given (expected llama.cpp's speculative flags such as "
                          "--spec-type ngram-simple; write --spec-type none for no speculation)")
    spec_type = f.get("spec_type", ("--spec-type", DEFAULT_SPEC_TYPE))[1]
    if spec_type not in SPEC_TYPES:
        raise ConfigError(f"{source}: --spec-type: unknown type {spec_type!r} (expected one of: {', '.join(SPEC_TYPES)})")
    ignored = [f[key][0] for key in sorted(f) if key not in _APPLIES_TO["common"]]
    if ignored and "spec_type" not in f:
        # llama.cpp's default type, none, ignores them: speculative flags without a type would run plain
        # decoding unnoticed. An explicit --spec-type none keeps them (a script switching speculation off).
        raise ConfigError(f"{source}: --spec-type defaults to none (no speculation), which ignores "
                          f"{', '.join(ignored)}: give --spec-type (e.g. {_TYPE_FOR_FLAG[_FLAGS[ignored[0]]]}), "
                          "or --spec-type none to run without speculation")
    if spec_type == "none":
        return None
    if spec_type in ("draft-dflash", "draft-dspark"):
        raise ConfigError(
            f"{source}: --spec-type {spec_type}: servesim has no drafter cost model for it "
            "(supported: draft-simple, draft-eagle3, draft-mtp, ngram-*)"
        )
    out: dict[str, Any] = {}
    if spec_type.startswith("ngram-"):
        n = _int(f["size_n"][1], f["size_n"][0], source) if "size_n" in f else DEFAULT_NGRAM_SIZE_N
        m = _int(f["size_m"][1], f["size_m"][0], source) if "size_m" in f else DEFAULT_NGRAM_SIZE_M
        out.update(method="ngram", num_speculative_tokens=m, prompt_lookup_min=n, prompt_lookup_max=n)
    else:
        k = _int(f["n_max"][1], f["n_max"][0], source) if "n_max" in f else DEFAULT_DRAFT_N_MAX
        out.update(method=_METHODS[spec_type], num_speculative_tokens=k)
        draft = f.get("draft_model", (None, None))[1]
        card = f.get("model_card", (None, None))[1]
        if spec_type == "draft-simple":
            if draft is None and card is None:
                raise ConfigError(f"{source}: --spec-type draft-simple needs a draft model (-md CARD_OR_PATH)")
            if card is None and draft.lower().endswith(".gguf"):
                raise ConfigError(
                    f"{source}: -md {draft}: servesim cannot read GGUF files; name the draft's model card with "
                    "--spec-model-card NAME (e.g. qwen3-0.6b) or pass a model card to -md"
                )
            out["model"] = card if card is not None else draft
        elif spec_type == "draft-eagle3" and draft is not None:
            out["model"] = draft  # a label: the EAGLE-3 head's cost comes from draft_head or the default head
    if "acceptance" in f:
        raw = f["acceptance"][1]
        out["acceptance"] = {"alpha": float(raw)} if _DECIMAL.fullmatch(raw) else raw  # else a profile's name
    if "temperature" in f:
        flag, raw = f["temperature"]
        if not _DECIMAL.fullmatch(raw) or not math.isfinite(float(raw)):
            raise ConfigError(f"{source}: {flag}: expected a number >= 0 (got {raw!r})")
        t = float(raw)
        if t < 0:
            raise ConfigError(f"{source}: {flag}: expected a number >= 0 (got {t})")
        out["temperature"] = t
    out["verification_rule"] = "match"
    out["draft_budget_limit"] = True
    return out


def draft_budget(n_draft_max: int, remaining_tokens: int) -> int:
    """Drafts llama.cpp's server allows in one round: ``max(0, min(n_draft_max, remaining_tokens - 1))``.

    ``remaining_tokens`` is the request's output budget left (``n_predict`` minus tokens generated so far),
    in tokens. Source: ``get_n_draft_max`` in ``tools/server/server-context.cpp`` (seed lesson, Example 10).
    """
    return max(0, min(int(n_draft_max), int(remaining_tokens) - 1))


@dataclass(frozen=True)
class LlamaCppRound:
    """One verification round: drafted tokens, accepted drafts, tokens added (accepted + 1, capped)."""

    drafted: int
    accepted: int
    tokens: int


def replay_request(n_predict: int, n_draft_max: int,
                   accept: Callable[[int, int, int], int]) -> list[LlamaCppRound]:
    """Replay one llama.cpp server request round by round under the draft budget limit.

    The first output token comes from the prompt pass; each later round drafts
    :func:`draft_budget` ``(n_draft_max, n_predict - generated)`` tokens, accepts
    ``accept(round_index, drafted, remaining_tokens)`` of them (clipped to ``[0, drafted]``) and adds
    ``accepted + 1`` tokens (never past ``n_predict``).

    Args:
        n_predict: the request's output budget in tokens, >= 1.
        n_draft_max: ``--spec-draft-n-max``, >= 0.
        accept: accepted drafts of a round from (round index from 0, drafted tokens, remaining tokens).

    Returns:
        The rounds in order (one list entry per target verification pass after the prompt pass).

    Raises:
        ValueError: ``n_predict < 1`` or ``n_draft_max < 0``.
    """
    if n_predict < 1 or n_draft_max < 0:
        raise ValueError(f"need n_predict >= 1 and n_draft_max >= 0 (got {n_predict}, {n_draft_max})")
    generated, rounds = 1, []
    while generated < n_predict:
        remaining = n_predict - generated
        d = draft_budget(n_draft_max, remaining)
        a = max(0, min(d, int(accept(len(rounds), d, remaining))))
        e = min(a + 1, remaining)
        rounds.append(LlamaCppRound(d, a, e))
        generated += e
    return rounds


def mean_acceptance_length(rounds: Sequence[LlamaCppRound]) -> float:
    """llama.cpp's ``mean len``: ``1 + accepted / rounds`` (tokens per verification round incl. the target's).

    Raises:
        ValueError: no rounds.
    """
    if not rounds:
        raise ValueError("no rounds")
    return 1.0 + sum(r.accepted for r in rounds) / len(rounds)
