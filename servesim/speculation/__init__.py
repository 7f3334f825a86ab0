"""servesim.speculation: the speculative-decoding model a run uses.

``speculative_config`` (vLLM's keys, ``config``), llama.cpp's flags mapped onto it (``llamacpp``),
acceptance profiles (``profile``) and their temperature model (``temperature``), tree drafts as
per-depth acceptance (``tree``), batch-size-dependent ``k`` (``schedule``) and drafter step costs
(``costs``). The offline tools that measure acceptance are in :mod:`servesim.acceptance`.
"""
