"""The user-facing top layer: the command line (`cli`, `commands`), a research thread (`session`)
and the terminal UI (`tui`)."""
