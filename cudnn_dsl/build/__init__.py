"""Building: lowering a graph to the cuDNN Frontend and driving cuDNN's build steps to executable plans."""
