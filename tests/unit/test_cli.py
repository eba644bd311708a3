"""The ``aip`` entry point itself (each command's own behaviour is tested with the command)."""

from __future__ import annotations

import pytest

from aip import cli


def test_ctrl_c_while_the_commands_import_exits_130_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(name: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.importlib, "import_module", interrupted)
    try:
        code = cli.main(["tail", "x"])
    except KeyboardInterrupt:  # re-raised here, it would stop the whole pytest session
        pytest.fail("a Ctrl-C during the commands' imports escaped aip's main")
    assert code == 130
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
