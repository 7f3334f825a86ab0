"""servesim.acceptance: offline tools that produce acceptance profiles and check drafters, not used by a run.

Closed forms of the i.i.d. acceptance model (``formulas``), verification rules on explicit tokens
(``verify``), n-gram drafting replayed against known answers (``ngram``), acceptance counters from vLLM and
llama.cpp logs (``logs``) and draft/target vocabulary checks (``vocab``). Their results reach the engine
only as acceptance profiles (:mod:`servesim.speculation.profile`); the commands are ``servesim acceptance``
and ``servesim check-draft`` (:mod:`servesim.cli`).
"""
