"""Every setting the code reads (agentruns/conf.py, support/conf.py) is in the README's table."""

from __future__ import annotations

from agentruns.setting import all_settings
from tests.procs import ROOT


def test_every_setting_is_documented_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Configuration") :]
    names = {setting.name for setting in all_settings()}
    missing = sorted(name for name in names if f"`{name}`" not in table)
    assert not missing, f"settings missing from the README's configuration table: {missing}"
