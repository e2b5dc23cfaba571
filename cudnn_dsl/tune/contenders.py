"""What `bench` times a compiled graph against: the contenders' names, labels and torch.compile modes (no torch
here: the command line checks --against before it imports any)."""

#: contender -> the torch.compile mode it uses (None: not torch.compile)
COMPILE_MODES = {"compile": "default", "max-autotune": "max-autotune", "reduce-overhead": "reduce-overhead"}
BASELINES = ("cudnn", "torch", *COMPILE_MODES)
LABELS = {
    "cudnn-dsl": "cudnn-dsl",
    "cudnn": "hand-written cuDNN",
    "torch": "torch eager",
    "compile": "torch.compile",
    "max-autotune": "compile max-autotune",
    "reduce-overhead": "compile reduce-ovh.",
}
