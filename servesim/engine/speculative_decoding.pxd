# Cython declarations for servesim/engine/speculative_decoding.py, read only by the compiled build
# (setup.py); the .py stays the only code and runs unchanged where it is interpreted. SpeculativeDecoding
# (the aggregated decoders of speculative decoding) becomes an extension type whose attributes are struct
# fields, reached without a dictionary lookup (about a fifth fewer instructions in a run:
# docs/architecture.md). Every field is a Python object, as in the .py: no C type, no change in results.
# ``__dict__`` keeps any other attribute working (only slower) and ``__weakref__`` weak references, as on
# any Python object. tests/test_compiled_engine.py checks that this list is the attributes
# SpeculativeDecoding sets, no more and no fewer.

cdef class SpeculativeDecoding:
    cdef dict __dict__
    cdef object __weakref__
    cdef public object acceptance_tables
    cdef public object accepted_per_pos
    cdef public object base_by_tokens
    cdef public object capacity
    cdef public object draft_budget_limit
    cdef public object draft_slots
    cdef public object emitted_blocks
    cdef public object engine
    cdef public object engine_ref
    cdef public object fixed_rates
    cdef public object fixed_segments
    cdef public object fixed_table
    cdef public object initial_k
    cdef public object k
    cdef public object known_at_join
    cdef public object lookahead_slots
    cdef public object mean_acceptance_length
    cdef public object num_accepted_tokens
    cdef public object num_decoders
    cdef public object num_draft_tokens
    cdef public object num_drafts
    cdef public object num_speculative_tokens
    cdef public object prefill_lookahead
    cdef public object round_offset
    cdef public object rounds_done
    cdef public object run_terms
    cdef public object segments
    cdef public object spec
    cdef public object static_k
    cdef public object step_base
    cdef public object step_computed
    cdef public object step_new_blocks
    cdef public object step_token_context
    cdef public object step_token_pairs
    cdef public object step_tokens
    cdef public object table_segments
    cdef public object timelines
    cdef public object use_eagle
    cdef public object variable_width
    cdef public object verify_widths
