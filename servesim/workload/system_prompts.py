"""Shared system prompts with a Zipf popularity, prepended to a workload's prompts.

``system_prompts: {num_prompts: K, prompt_tokens: LENGTH, zipf_exponent: s, probability: p}`` in any
workload: the workload has ``K`` system prompts, prompt ``k`` (rank ``k + 1``) of ``L_k`` tokens drawn once
from ``prompt_tokens`` (or given: ``prompt_lengths: [L_0, L_1, ...]``, most popular first); each request (each session, for ``multi_turn``) carries one with probability ``p``,
prompt ``k`` with probability ``(k + 1)^-s / sum_j (j + 1)^-s`` (Zipf's law over ranks; ``s = 0`` is uniform;
Breslau et al., "Web caching and Zipf-like distributions", INFOCOM 1999, for the finite-N form). A carried
system prompt is put before the request's own prompt: its prompt grows by ``L_k`` tokens and
``Workload.content`` gains a first segment (content id ``NAMESPACE_SYSTEM_PROMPT, k``) that every request
with prompt ``k`` shares, so their first ``floor(L_k / block_size)`` KV blocks have equal hashes.

Draws: three child generators of the caller's (prompt lengths, choices, whether a request carries one), so
changing ``probability`` leaves the lengths and the choices unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import ConfigDict, Field, model_validator

from servesim.input_models import InputModel
from servesim.workload.lengths import LengthConfig
from servesim.workload.rawtrace import MAX_TOKEN_COUNT
from servesim.workload.workload import Workload


class SystemPromptsConfig(InputModel):
    """``system_prompts:`` shared system prompts with a Zipf popularity (see the module docstring)."""

    model_config = ConfigDict(defer_build=True, extra="forbid", allow_inf_nan=False)

    num_prompts: int | None = Field(None, ge=1, description="number of distinct system prompts")
    prompt_tokens: LengthConfig | None = Field(
        None, description="length of each system prompt (tokens), drawn once per prompt"
    )
    prompt_lengths: list[Annotated[int, Field(ge=1, le=MAX_TOKEN_COUNT)]] | None = Field(
        None, min_length=1, description="or: the prompts' lengths (tokens), most popular first"
    )
    zipf_exponent: float = Field(1.0, ge=0, description="popularity of rank r is proportional to r^-s (0 = uniform)")
    probability: float = Field(1.0, ge=0, le=1, description="share of requests (sessions) that carry one")

    @model_validator(mode="after")
    def _check_lengths(self) -> "SystemPromptsConfig":
        if (self.prompt_tokens is None) == (self.prompt_lengths is None):
            raise ValueError("give exactly one of prompt_tokens (with num_prompts) and prompt_lengths")
        if self.prompt_lengths is None:
            if self.num_prompts is None:
                raise ValueError("num_prompts is required with prompt_tokens")
        elif self.num_prompts is None:
            self.num_prompts = len(self.prompt_lengths)
        elif self.num_prompts != len(self.prompt_lengths):
            raise ValueError(
                f"num_prompts ({self.num_prompts}) must equal the number of prompt_lengths "
                f"({len(self.prompt_lengths)})"
            )
        return self


def zipf_popularity(num_prompts: int, zipf_exponent: float) -> np.ndarray:
    """Probability of each rank under a finite Zipf law: ``p_k = (k + 1)^-s / sum_j (j + 1)^-s``.

    Args:
        num_prompts: K >= 1.
        zipf_exponent: s >= 0.

    Returns:
        float64 ``(K,)``, summing to 1, non-increasing.
    """
    weights = np.arange(1, num_prompts + 1, dtype=np.float64) ** -float(zipf_exponent)
    return weights / weights.sum()


@dataclass(frozen=True)
class SystemPromptDraw:
    """The drawn system prompts and who carries which.

    Attributes:
        prompt_tokens: int64 ``(K,)``, tokens of each system prompt.
        choice: int64 ``(M,)``, the prompt each unit (request or session) carries, -1 for none.
        label: a short description for the workload's ``description``.
    """

    prompt_tokens: np.ndarray
    choice: np.ndarray
    label: str

    def tokens_of(self, units: np.ndarray) -> np.ndarray:
        """int64: system prompt tokens of each given unit (0 where it carries none)."""
        picked = self.choice[units]
        return np.where(picked >= 0, self.prompt_tokens[np.maximum(picked, 0)], 0)


def draw_system_prompts(
    cfg: SystemPromptsConfig, num_units: int, rng: np.random.Generator, base_dir: Path | None
) -> SystemPromptDraw:
    """Draw the prompts' lengths and each unit's prompt (see the module docstring).

    Raises:
        TraceError: an empirical length distribution's trace is missing or malformed.
    """
    length_rng, choice_rng, carry_rng = rng.spawn(3)
    if cfg.prompt_tokens is not None:
        lengths = cfg.prompt_tokens.build(base_dir)
        prompt_tokens = lengths.sample(length_rng, cfg.num_prompts)
        sizes = f"{lengths.describe()} tokens"
    else:
        prompt_tokens = np.array(cfg.prompt_lengths, dtype=np.int64)
        sizes = "given lengths"
    p = zipf_popularity(cfg.num_prompts, cfg.zipf_exponent)
    choice = choice_rng.choice(cfg.num_prompts, size=num_units, p=p).astype(np.int64)
    if cfg.probability < 1:
        choice[carry_rng.random(num_units) >= cfg.probability] = -1
    label = (
        f"{cfg.num_prompts} system prompts of {sizes}, Zipf s {cfg.zipf_exponent:g}"
        + (f", carried by {cfg.probability:.0%}" if cfg.probability < 1 else "")
    )
    return SystemPromptDraw(prompt_tokens, choice, label)


def prepend_system_prompts(workload: Workload, draw: SystemPromptDraw, unit: np.ndarray | None = None) -> Workload:
    """The workload with each request's system prompt put before its prompt.

    Args:
        workload: N requests; its ``content`` (or, if None, unshared content) is extended.
        draw: the system prompts.
        unit: int64 ``(N,)``, the unit of ``draw.choice`` each request belongs to (its session); None =
            request ``i`` is unit ``i``.

    Returns:
        A new Workload: prompts longer by their system prompt's tokens, ``content`` with the shared first
        segment, the description extended.
    """
    from servesim.workload.content import NAMESPACE_SYSTEM_PROMPT, SequenceContent, content_id

    units = np.arange(len(workload), dtype=np.int64) if unit is None else unit
    extra = draw.tokens_of(units)
    base = workload.content
    if base is None:
        base = SequenceContent.unique(workload.prompt_tokens, workload.output_tokens)
    content = base.prepend(content_id(NAMESPACE_SYSTEM_PROMPT, np.maximum(draw.choice[units], 0)), extra)
    return dataclasses.replace(
        workload,
        prompt_tokens=workload.prompt_tokens + extra,
        content=content,
        description=f"{workload.description}, {draw.label}",
    )
