"""The persistent embedding store: image embeddings kept by content hash and runtime
identity, as safetensors files in a directory or any fsspec location, shared by
``sam2serve embed`` (which fills it ahead of time) and ``sam2serve serve --store``
(which reads it behind its memory cache and writes through).

- :mod:`~sam2serve.store.identity`: the image id and the runtime identity (torch-free)
- :mod:`~sam2serve.store.entry`: one embedding <-> one safetensors file, checked on read
- :mod:`~sam2serve.store.embedding_store`: the store itself (fsspec, write-then-rename)
"""
