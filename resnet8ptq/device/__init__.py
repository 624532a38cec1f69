"""The device model: one integer form of quantized models, its executor, and compute-in-memory limits."""
