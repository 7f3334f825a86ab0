"""Break one of vLLM's prefix-caching rules, rerun the ``prefix_*`` scenarios and list the traces that change.

A check of the scenarios themselves: each rule they claim to pin must change at least one committed golden
trace when vLLM's own code is patched to break it (in this process only; vLLM's files are not touched).
Needs the oracle's vLLM (``oracle/install.sh``)::

    oracle/.venv/bin/python oracle/mutate_vllm.py            # every mutation
    oracle/.venv/bin/python oracle/mutate_vllm.py no_drop    # one

Mutations (vLLM 0.32 ``v1/core/``):

* ``forward_free``: a finished or preempted request's blocks go back to the free queue head block first
  (vLLM: reversed, so its tail blocks are evicted first);
* ``mru_evict``: new blocks are taken from the free queue's tail (the most recently freed) instead of its
  head (least recently used);
* ``no_drop``: no EAGLE/MTP trailing-block drop;
* ``prompt_only``: only prompt blocks are cached (vLLM also caches decode blocks as they fill);
* ``deferred``: blocks are cached at the next ``schedule()`` call instead of at allocation (no sharing
  within a step).
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import vllm_oracle  # noqa: E402

GOLDEN = HERE.parent / "tests" / "data" / "golden"


def mutate(name: str) -> None:
    from vllm.v1.core import kv_cache_coordinator, kv_cache_utils, single_type_kv_cache_manager
    from vllm.v1.core.sched import scheduler

    manager = single_type_kv_cache_manager
    coordinator = kv_cache_coordinator.KVCacheCoordinator
    if name == "forward_free":
        def free(self, request_id):
            self.block_pool.free_blocks(self.pop_blocks_for_free(request_id))
        manager.SingleTypeKVCacheManager.free = free
    elif name == "mru_evict":
        def popleft_n(self, n):
            taken = self.get_all_free_blocks()[::-1][:n]
            for block in taken:
                self.remove(block)
            return taken
        kv_cache_utils.FreeKVCacheBlockQueue.popleft_n = popleft_n
    elif name == "no_drop":
        find = manager.FullAttentionManager.find_longest_cache_hit.__func__

        def no_drop(cls, *args, **kwargs):
            kwargs["drop_eagle_block"] = False
            return find(cls, *args, **kwargs)
        manager.FullAttentionManager.find_longest_cache_hit = classmethod(no_drop)
    elif name == "prompt_only":
        cache = coordinator.cache_blocks
        coordinator.cache_blocks = lambda self, request, n: cache(self, request, min(n, request.num_prompt_tokens))
    elif name == "deferred":
        cache = coordinator.cache_blocks
        pending: list = []
        coordinator.cache_blocks = lambda self, request, n: pending.append((self, request, n))
        schedule = scheduler.Scheduler.schedule

        def deferred(self, *args, **kwargs):
            for coord, request, n in pending:
                if request.request_id in coord.single_type_managers[0].req_to_blocks:
                    cache(coord, request, n)
            pending.clear()
            return schedule(self, *args, **kwargs)
        scheduler.Scheduler.schedule = deferred
    else:
        raise SystemExit(f"mutate_vllm: unknown mutation {name!r} (one of {', '.join(MUTATIONS)})")


MUTATIONS = ("forward_free", "mru_evict", "no_drop", "prompt_only", "deferred")


def changed_traces() -> list[str]:
    v = vllm_oracle._vllm()
    out = []
    for path in sorted(GOLDEN.glob("prefix_*.json.gz")):
        with gzip.open(path, "rt") as fh:
            golden = json.load(fh)
        try:
            same = vllm_oracle.run_scenario(v, golden["scenario"])["steps"] == golden["steps"]
        except (SystemExit, AssertionError, ValueError) as err:  # the broken rule crashed vLLM's scheduler
            same = False
            print(f"  {golden['scenario']['name']}: {type(err).__name__}")
        if not same:
            out.append(golden["scenario"]["name"])
    return out


def main(argv: list[str]) -> int:
    if not argv:  # each mutation in its own process: a patch stays for the whole process
        import subprocess
        return max(subprocess.call([sys.executable, __file__, name]) for name in MUTATIONS)
    mutate(argv[0])
    changed = changed_traces()
    print(f"{argv[0]}: {len(changed)} traces change: {', '.join(changed) or 'NONE (the rule is not pinned)'}")
    return 0 if changed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
