"""The translation service: serves exported ONNX bundles with ONNX Runtime, never torch."""
