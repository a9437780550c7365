"""The models: ONNX Runtime sessions, the decoder step's cache, the numpy search, and loading
the served bundles."""
