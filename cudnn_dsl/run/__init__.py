"""Running: a compiled graph bound to torch buffers and launched, whole or in parts; its reference."""
