"""The device model: an integer description of quantized models, its executor, and compute-in-memory limits."""
