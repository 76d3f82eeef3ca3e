"""How the hostile-input tables check one command: run clbench's ``main`` in-process and check what a user sees.

:func:`run_cli` returns the exit code and both streams; :func:`assert_outcome` checks them: the expected exit code,
no traceback, no terminal escape, and for a refusal (exit 2) exactly one ``clbench: error:`` line naming the problem,
followed by at most one hint line (progress lines may come first: a refusal found mid-run ends the output)."""

from __future__ import annotations

from clbench.cli import main


def run_cli(argv: list[str], capsys) -> tuple[int | str | None, str, str]:
    capsys.readouterr()  # what building the case printed
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def assert_outcome(code, out: str, err: str, want: int, needle: str, stream: str = "err", flat: bool = False) -> None:
    """``flat``: match ``needle`` against the stream with its white space folded (rich wraps long lines)."""
    assert code == want, (code, err[-3000:], out[-2000:])
    assert "Traceback" not in err + out, err
    assert "\x1b" not in err + out and "\x07" not in err + out, (err, out)  # no escape sequence reaches the terminal
    if want == 2:
        assert err.count("clbench: error: ") == 1, err
        lines = err[err.index("clbench: error: ") :].strip("\n").split("\n")
        assert needle in lines[0], err
        assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("  hint: ")), err
    else:
        text = out if stream == "out" else err
        assert needle in (" ".join(text.split()) if flat else text), (out, err)
