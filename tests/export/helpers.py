"""Running decoder_step.onnx as the engine does: each past bound as its own present."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from service.bundle.manifest import LOG_PROBS, TOP_IDS, TOP_LOG_PROBS, past_names, present_names


def run_step(
    session: ort.InferenceSession,
    feeds: dict[str, np.ndarray],
    cache: dict[str, np.ndarray],
    n_layers: int,
) -> dict[str, np.ndarray]:
    """One step; the cache arrays (by past name) are written in place. Returns log_probs and
    the top-k candidates."""
    binding = session.io_binding()
    for name, value in feeds.items():
        binding.bind_cpu_input(name, value)
    outputs = (LOG_PROBS, TOP_LOG_PROBS, TOP_IDS)
    for name in outputs:
        binding.bind_output(name)
    for past, present in zip(past_names(n_layers), present_names(n_layers), strict=True):
        value = ort.OrtValue.ortvalue_from_numpy(cache[past])
        binding.bind_ortvalue_input(past, value)
        binding.bind_ortvalue_output(present, value)
    session.run_with_iobinding(binding)
    values = binding.copy_outputs_to_cpu()[: len(outputs)]  # in the order bound
    return dict(zip(outputs, values, strict=True))
