"""``--help`` names the command as it was run: ``tgo-observe`` / ``tgo-report`` from the console scripts (pyproject.toml
[project.scripts]: their wrappers leave the script's path in ``sys.argv[0]``), ``python -m`` otherwise."""

from __future__ import annotations

import sys

import pytest

from tgo import observe
from tgo.report import __main__ as report


@pytest.mark.parametrize(
    "cli, script, module", [(observe, "tgo-observe", "tgo.observe"), (report, "tgo-report", "tgo.report")]
)
def test_help_names_the_console_script_or_python_dash_m(cli, script, module, monkeypatch, capsys) -> None:
    for argv0, usage in [
        (f"/venv/bin/{script}", f"usage: {script} [-h]"),
        (f"/site-packages/{module.replace('.', '/')}.py", f"usage: python -m {module} [-h]"),  # what -m sets
    ]:
        monkeypatch.setattr(sys, "argv", [argv0, "--help"])
        with pytest.raises(SystemExit) as done:
            cli.parse_args()
        assert done.value.code == 0 and capsys.readouterr().out.startswith(usage)
