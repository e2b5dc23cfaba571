"""`cudnn-dsl device-info`: the local GPU's cuDNN descriptor, for --device-properties elsewhere."""

from __future__ import annotations

from cudnn_dsl.cli import common

HELP = "print the cuDNN descriptor of the local GPU (for --device-properties)"


def register(p) -> None:
    p.set_defaults(run=run)


def run(args) -> int:
    from cudnn_dsl.target.library import local_device_info

    print(local_device_info())
    return common.EXIT_OK
