"""Multi-turn conversations: sessions arrive, each sends turns whose prompts resend the whole history.

``type: multi_turn`` (:class:`~servesim.workload.config.MultiTurnWorkloadConfig`). Sessions start by a
renewal process at ``rate`` sessions/s (gamma gaps with coefficient of variation ``cv``; ``cv: 1`` is a
Poisson process), ``num_sessions`` of them or all those starting in ``[0, duration_s)``. Session ``s`` has
``T_s`` turns (``turns``, a length distribution, >= 1). Turn ``t`` (0-based) sends a new user message of
``m_{s,t}`` tokens (``message_tokens``) and generates ``o_{s,t}`` tokens (``output_tokens``); its prompt
is the history, every earlier message and output of the session in order, followed by the new message::

    prompt_{s,t} = [system prompt of s] + sum_{u < t} (m_{s,u} + o_{s,u}) + m_{s,t}     (tokens)

so the sequence of turn ``t`` (prompt then output) is a prefix of every later turn's prompt, and
``Workload.content`` says so: the segments of turn ``t`` are ``m_{s,0}, o_{s,0}, ..., m_{s,t}, o_{s,t}``
(content ids ``NAMESPACE_MESSAGE`` / ``NAMESPACE_OUTPUT`` indexed by the turn's position in session order),
after the session's system prompt if ``system_prompts`` is set (one draw per session, see
:mod:`servesim.workload.system_prompts`).

Timing is open loop, fixed in advance (the engine's closed loop issues requests in index order to any
client, not per session): turn 0 arrives when the session starts and turn ``t + 1`` arrives ``g_{s,t+1}``
seconds after turn ``t`` arrived, with ``g`` gamma-distributed of mean ``think_time_s`` and coefficient of
variation ``think_time_cv`` (0 = always ``think_time_s``; 1 = exponential). The gap is counted from the
previous turn's arrival, not its answer: choose a think time well above the expected response time, or
under heavy load a turn can arrive before the previous answer has finished (its history is still the full
previous output, as if the client had waited for it).

Draws: six child generators of the caller's (session starts, turns, messages, outputs, think times,
system prompts), so changing one distribution leaves the others' draws unchanged. Requests are sorted by
arrival time (ties keep session order); ``Workload.sessions`` gives each request's session and turn.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from servesim.workload.arrival_processes import gamma_arrivals, poisson_arrivals
from servesim.workload.content import NAMESPACE_MESSAGE, NAMESPACE_OUTPUT, SequenceContent, content_id
from servesim.workload.system_prompts import draw_system_prompts, prepend_system_prompts
from servesim.workload.workload import Sessions, Workload
from servesim.workload.memory_bound import check_requests_fit, check_synthetic_size

if TYPE_CHECKING:
    from servesim.workload.config import MultiTurnWorkloadConfig


def _within_session_exclusive_cumsum(values: np.ndarray, first: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """For values laid out session after session, the sum of the session's earlier values (int or float)."""
    run = np.cumsum(values)
    before = run - values
    return before - np.repeat(before[first], counts) if values.size else before


def think_gaps(mean_s: float, cv: float, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` think-time gaps (s), float64: gamma with mean ``mean_s`` and coefficient of variation ``cv``.

    Shape ``1 / cv^2``, scale ``mean_s cv^2``; ``cv = 0`` or ``mean_s = 0`` gives the constant ``mean_s``
    (no draw).
    """
    if cv == 0 or mean_s == 0:
        return np.full(n, float(mean_s))
    return rng.gamma(1.0 / cv**2, mean_s * cv**2, size=n)


def build_multi_turn(cfg: MultiTurnWorkloadConfig, rng: np.random.Generator, base_dir: Path | None = None) -> Workload:
    """Build a ``multi_turn`` workload (see the module docstring).

    Args:
        cfg: a validated :class:`~servesim.workload.config.MultiTurnWorkloadConfig`.
        rng: the caller's generator (six children are spawned from it).
        base_dir: folder for relative paths of empirical length distributions.

    Returns:
        An open-loop Workload with ``content`` and ``sessions`` set, requests sorted by arrival (s).

    Raises:
        TraceError: an empirical length distribution's trace is missing or malformed.
        SettingError: no session starts within ``duration_s``.
    """
    start_rng, turns_rng, message_rng, output_rng, think_rng, system_rng = rng.spawn(6)
    check_synthetic_size(cfg.num_sessions, cfg.rate, cfg.duration_s, "num_sessions")
    if cfg.cv == 1:
        starts = poisson_arrivals(cfg.rate, start_rng, cfg.num_sessions, cfg.duration_s)
    else:
        starts = gamma_arrivals(cfg.rate, cfg.cv, start_rng, cfg.num_sessions, cfg.duration_s)
    num_sessions = len(starts)
    if not num_sessions:  # only a duration_s can leave no session: nothing would be simulated
        from servesim.errors import SettingError

        raise SettingError(f"workload.duration_s: no session starts in {cfg.duration_s:g} s at {cfg.rate:g} "
                           "sessions/s (with this seed): lengthen duration_s or raise the rate")
    turns_dist = cfg.turns.build(base_dir)
    message_dist = cfg.message_tokens.build(base_dir)
    output_dist = cfg.output_tokens.build(base_dir)
    turns = turns_dist.sample(turns_rng, num_sessions)
    n = int(turns.sum())
    check_requests_fit(n, "workload.turns", "turns (requests)")
    session = np.repeat(np.arange(num_sessions, dtype=np.int64), turns)
    first = np.cumsum(turns) - turns  # position of each session's turn 0 in session order
    turn = np.arange(n, dtype=np.int64) - np.repeat(first, turns)
    message = message_dist.sample(message_rng, n)
    output = output_dist.sample(output_rng, n)
    gap = think_gaps(cfg.think_time_s, cfg.think_time_cv, think_rng, n)
    gap[turn == 0] = 0.0
    arrival = starts[session] + _within_session_exclusive_cumsum(gap, first, turns) + gap
    prompt = _within_session_exclusive_cumsum(message + output, first, turns) + message

    # Turn f's sequence is the session's pieces m_0, o_0, ..., m_t, o_t (2 (t + 1) segments).
    flat = np.arange(n, dtype=np.int64)
    piece_ids = np.empty(2 * n, dtype=np.uint64)
    piece_ids[0::2] = content_id(NAMESPACE_MESSAGE, flat)
    piece_ids[1::2] = content_id(NAMESPACE_OUTPUT, flat)
    piece_tokens = np.empty(2 * n, dtype=np.int64)
    piece_tokens[0::2] = message
    piece_tokens[1::2] = output
    counts = 2 * (turn + 1)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    idx = np.repeat(2 * first[session] - offsets[:-1], counts) + np.arange(int(offsets[-1]), dtype=np.int64)
    content = SequenceContent(offsets, piece_ids[idx], piece_tokens[idx])

    order = np.argsort(arrival, kind="stable")
    workload = Workload(
        arrival_s=arrival[order],
        prompt_tokens=prompt[order],
        output_tokens=output[order],
        description=(
            f"multi-turn: {num_sessions} sessions at {cfg.rate:g} sessions/s (gap cv {cfg.cv:g}), {n} requests, "
            f"turns {turns_dist.describe()}, message {message_dist.describe()} tokens, "
            f"output {output_dist.describe()} tokens, think time {cfg.think_time_s:g} s (cv {cfg.think_time_cv:g})"
        ),
        content=content.take(order),
        sessions=Sessions(session_id=session[order], turn_index=turn[order]),
    )
    if cfg.system_prompts is not None:
        draw = draw_system_prompts(cfg.system_prompts, num_sessions, system_rng, base_dir)
        workload = prepend_system_prompts(workload, draw, workload.sessions.session_id)
    return workload
