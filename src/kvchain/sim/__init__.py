"""Trace-driven serving simulator: request traces, GPU cost model, event loop, metrics."""
