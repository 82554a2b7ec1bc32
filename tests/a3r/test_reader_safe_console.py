"""``a3r vibe … | head``: the reader goes away, the thread must go on (no BrokenPipeError)."""

from __future__ import annotations

import os

from a3r.app.commands import ReaderSafeConsole


def test_a_closed_pipe_silences_the_output_instead_of_raising() -> None:
    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w")
    console = ReaderSafeConsole(file=stream, highlight=False, soft_wrap=True)
    try:
        console.print("· first line")
        with os.fdopen(read_end) as reader:
            assert reader.readline() == "· first line\n"
        # `head -1` has exited: writing to the pipe now raises BrokenPipeError (SIGPIPE is ignored);
        # rich's own console would raise SystemExit(1) here.
        for n in range(3):
            console.print(f"· line {n} after the reader left")
        # The descriptor now points at /dev/null: later writes by anyone succeed.
        assert console.quiet
        assert os.write(stream.fileno(), b"x") == 1
        assert os.path.samestat(os.fstat(stream.fileno()), os.stat(os.devnull))
    finally:
        stream.close()
