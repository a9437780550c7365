"""The bundle contract, at the bottom of the house: what `export/` writes and `service/` reads.

manifest.py (format, tensor names, schema, hashing, loading and validation), tokenizer.py (the
bundle's tokenizer files), decoding.py (the search options and rules both sides follow). It
imports no other part of the project, and no torch, onnx or web framework: `model/`, `export/`
and every room of `service/` import it.
"""
