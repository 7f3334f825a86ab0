# Cython declarations for servesim/engine/core.py, read only by the compiled build (setup.py); the .py stays
# the only code and runs unchanged where it is interpreted. Engine (the scheduler's state: per-request
# lists, queues, clock, logs) becomes an extension type whose attributes are struct fields, reached without
# a dictionary lookup (about a fifth fewer instructions in a run: docs/architecture.md). Every field is a
# Python object, as in the .py: no C type, no change in results. ``__dict__`` keeps any other attribute
# working (only slower) and ``__weakref__`` weak references, as on any Python object.
# tests/test_compiled_engine.py checks that this list is the attributes Engine sets, no more and no fewer.

cdef class Engine:
    cdef dict __dict__
    cdef object __weakref__
    cdef public object _arrived
    cdef public object aggregated_at_step
    cdef public object arrival_ps
    cdef public object arrivals
    cdef public object async_scheduling
    cdef public object block_size
    cdef public object clock_subps
    cdef public object closed_runs
    cdef public object decode_ready
    cdef public object decoding
    cdef public object draft_slots
    cdef public object emitted_tokens
    cdef public object enable_chunked_prefill
    cdef public object explicit_steps_left
    cdef public object extra_itl
    cdef public object fallback_stretch
    cdef public object finish_heap
    cdef public object finish_ps
    cdef public object finish_step
    cdef public object finished
    cdef public object finished_output
    cdef public object finishing
    cdef public object first_scheduled_ps
    cdef public object first_token_ps
    cdef public object free_blocks
    cdef public object k_next
    cdef public object kv
    cdef public object kv_cached_tokens
    cdef public object kv_late
    cdef public object kv_output_tokens
    cdef public object kv_runs
    cdef public object kv_safe_ps
    cdef public object kv_windows
    cdef public object last_emit_ps
    cdef public object lookahead_slots
    cdef public object max_num_batched_tokens
    cdef public object max_num_seqs
    cdef public object max_time_ps
    cdef public object mode
    cdef public object multi_partial
    cdef public object now
    cdef public object num_blocks
    cdef public object num_cached_tokens
    cdef public object num_computed
    cdef public object num_generated
    cdef public object num_preemptions
    cdef public object num_requests
    cdef public object num_unsure_finishing
    cdef public object output_cached
    cdef public object output_tokens
    cdef public object partial
    cdef public object prefill_lookahead
    cdef public object prefix_cache_stats
    cdef public object prefix_caching
    cdef public object prompt_tokens
    cdef public object rejected_at_step
    cdef public object rejected_drafts
    cdef public object reprefill_tokens
    cdef public object row_log
    cdef public object rows
    cdef public object run_records
    cdef public object running
    cdef public object stale
    cdef public object step_index
    cdef public object step_time
    cdef public object total_blocks
    cdef public object tracer
    cdef public object waiting
