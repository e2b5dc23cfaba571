"""The target: the cuDNN library and its loader, GPU descriptors, dtypes, memory formats, cuDNN's quirks."""
