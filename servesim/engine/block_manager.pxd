# Cython declarations for servesim/engine/block_manager.py, read only by the compiled build (setup.py); the
# .py stays the only code and runs unchanged where it is interpreted. BlockManager (the KV-cache blocks and
# the prefix cache) becomes an extension type whose attributes are struct fields, reached without a
# dictionary lookup (about a fifth fewer instructions in a run: docs/architecture.md). Every field is a
# Python object, as in the .py: no C type, no change in results. ``__dict__`` keeps any other attribute
# working (only slower) and ``__weakref__`` weak references, as on any Python object.
# tests/test_compiled_engine.py checks that this list is the attributes BlockManager sets, no more and no
# fewer.

cdef class BlockManager:
    cdef dict __dict__
    cdef object __weakref__
    cdef public object block_size
    cdef public object content
    cdef public object enabled
    cdef public object hash_to_blocks
    cdef public object hashes
    cdef public object held_shared
    cdef public object lagging
    cdef public object num_free
    cdef public object num_uncached
    cdef public object own_runs
    cdef public object queue
    cdef public object shareable
    cdef public object use_eagle
