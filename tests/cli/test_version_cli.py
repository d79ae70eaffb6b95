"""`dpfy --version` prints the installed package's version."""

import pytest


def test_version_flag_prints_the_package_version(capsys):
    import dpfy
    from dpfy.cli import main
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"dpfy {dpfy.__version__}"
