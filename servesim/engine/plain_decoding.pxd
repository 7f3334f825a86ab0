# Cython declarations for servesim/engine/plain_decoding.py, read only by the compiled build (setup.py); the
# .py stays the only code and runs unchanged where it is interpreted. PlainDecoding (the aggregated decoders
# of plain decoding) becomes an extension type whose attributes are struct fields, reached without a
# dictionary lookup (about a fifth fewer instructions in a run: docs/architecture.md). Every field is a
# Python object, as in the .py: no C type, no change in results. ``__dict__`` keeps any other attribute
# working (only slower) and ``__weakref__`` weak references, as on any Python object.
# tests/test_compiled_engine.py checks that this list is the attributes PlainDecoding sets, no more and no
# fewer.

cdef class PlainDecoding:
    cdef dict __dict__
    cdef object __weakref__
    cdef public object block_size
    cdef public object blocks_at_join
    cdef public object context_base
    cdef public object context_base_sum
    cdef public object decode_subps_per_token
    cdef public object engine
    cdef public object engine_ref
    cdef public object generated_at_join
    cdef public object joined_at
    cdef public object k
    cdef public object num_decoders
    cdef public object per_residue
    cdef public object per_residue_twice
    cdef public object run_terms
    cdef public object speculative
    cdef public object stale_joins
    cdef public object variable_width
