"""Torch integration: a compiled graph as a torch operator, and training through derived backward graphs."""
