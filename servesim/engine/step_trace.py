"""A per-step record of the engine's scheduling decisions, to compare with vLLM's own scheduler.

Off by default (``Engine.tracer is None``); the golden-trace tests (``tests/test_golden_vllm.py``) switch
it on and compare every step with the trace vLLM 0.32's scheduler wrote for the same scenario
(``oracle/``). Both modes record every engine step: run mode expands its runs of decode steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TraceStep:
    """One engine step.

    Attributes:
        start_ps: when the step started (integer ps).
        scheduled: ``(request, tokens, drafts)`` per scheduled request, in vLLM's order (running requests
            in admission order, then the requests admitted in this step); ``tokens`` includes the drafts.
        preempted: requests preempted in this step, in order.
        kv_blocks_used: KV blocks held after scheduling (before finished requests free theirs).
        num_waiting: waiting requests at the start of the step.
        k: drafts per request proposed after this step (vLLM's ``num_spec_tokens_to_schedule``; 0 without
            speculation).
        new_computed: ``(request, num_computed_tokens)`` of the requests admitted from the waiting queue in
            this step, with prefix caching on (the computed tokens at admission are the prefix-cache hit).
        prefix_cache: this step's prefix-cache counters (:class:`~servesim.engine.block_manager.PrefixCacheStats`
            fields, tokens), with prefix caching on.
    """

    start_ps: int
    scheduled: list[tuple[int, int, int]]
    preempted: list[int]
    kv_blocks_used: int
    num_waiting: int
    k: int
    new_computed: list[tuple[int, int]] = field(default_factory=list)
    prefix_cache: dict[str, int] = field(default_factory=dict)


@dataclass
class StepTracer:
    """Collects :class:`TraceStep` records; the engine appends preemption victims to ``victims`` as they
    happen and :meth:`record` attaches them to the step."""

    steps: list[TraceStep] = field(default_factory=list)
    victims: list[int] = field(default_factory=list)
    new_computed: list[tuple[int, int]] = field(default_factory=list)
    prefix_cache: dict[str, int] = field(default_factory=dict)

    def record_hit(self, request: int, num_tokens: int, num_hits: int, preempted: bool) -> None:
        """A waiting request admitted with a prefix-cache lookup (tokens) in the step being scheduled."""
        self.new_computed.append((int(request), int(num_hits)))
        stats = self.prefix_cache
        prefix = "preempted_" if preempted else ""
        for name, value in (("requests", 1), ("queries", num_tokens), ("hits", num_hits)):
            stats[prefix + name] = stats.get(prefix + name, 0) + int(value)

    def record(self, start_ps: int, scheduled, kv_blocks_used: int, num_waiting: int, k: int) -> None:
        """Add one step (``scheduled``: iterable of ``(request, tokens, drafts)``)."""
        self.steps.append(TraceStep(int(start_ps), [tuple(map(int, e)) for e in scheduled], self.victims,
                                    int(kv_blocks_used), int(num_waiting), int(k), self.new_computed,
                                    self.prefix_cache))
        self.victims = []
        self.new_computed = []
        self.prefix_cache = {}
