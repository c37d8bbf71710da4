"""Shared memory: one lifecycle for a fleet's segments, the slot table and its kernels, the data-plane rings, and status read from them."""
