"""Storing: the versioned plan store and the shared kernel caches."""
