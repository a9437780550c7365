"""Checkpoint -> ONNX bundle (onnx_export), its torch parity check (parity) and its fp16/int8
variants (quantize). Imports torch and onnx; the serving side reads bundles through
service/bundle/manifest.py only."""
