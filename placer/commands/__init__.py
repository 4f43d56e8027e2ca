"""One module per `placer` command: `add_arguments(parser)` and `run(args) -> int`."""
