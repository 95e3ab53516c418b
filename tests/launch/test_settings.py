"""A wrong ``DLCP_*`` setting is one line that names the variable the user set and
the value given (the configuration's own errors name its fields:
``emulated_loss=2.0 outside [0, 1)``), and launchers say it once, before any rank
starts, instead of a traceback from every rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlcp.errors import ConfigError
from dlcp.launch import run_cli
from dlcp.settings import check_env, config_from_env


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"DLCP_EMULATED_LOSS": "2"}, "DLCP_EMULATED_LOSS=2 outside [0, 1)"),
        ({"DLCP_N_PATHS": "0"}, "DLCP_N_PATHS=0 outside 1..256"),
        ({"DLCP_TIMEOUT": "abc"}, "DLCP_TIMEOUT='abc' is not a valid float"),
        ({"DLCP_NPATHS": "3"}, "unknown configuration variable DLCP_NPATHS"),
        ({"DLCP_TIMEOUT": "5", "DLCP_EMULATED_LOSS": "-1", "HOME": "/"},
         "DLCP_EMULATED_LOSS=-1 outside [0, 1)"),
    ],
)  # fmt: skip
def test_the_error_names_the_variable_and_its_value(env: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_env(env)
    assert str(err.value) == says
    assert check_env(env) == says


def test_an_error_of_two_settings_together_never_shows_the_secret() -> None:
    secret = "e124d25d0e33a44ff577758bff7c181da806097e10b70630cdc9cc7cff59ed96"
    env = {"DLCP_MTU": "600", "DLCP_PAYLOAD_BYTES": "1400", "DLCP_JOB_SECRET": secret}
    said = check_env(env)
    assert said is not None and "DLCP_MTU=600" in said and "DLCP_PAYLOAD_BYTES=1400" in said
    assert secret not in said and "DLCP_JOB_SECRET" not in said


def test_variables_read_elsewhere_are_not_refused() -> None:
    assert check_env({"DLCP_SIM_TRACE_RECEIVER": "/tmp/trace", "DLCP_SIM_TRACE_TCP": "1"}) is None


def test_good_settings_pass() -> None:
    env = {"DLCP_TIMEOUT": "5", "DLCP_N_PATHS": "8", "PATH": "/bin"}
    assert check_env(env) is None
    assert config_from_env(env).timeout == 5


def test_dlcp_launch_says_it_once_and_starts_no_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "rank.py"
    script.write_text("import pathlib, os\npathlib.Path(__file__ + os.environ['RANK']).touch()\n")
    monkeypatch.setenv("DLCP_EMULATED_LOSS", "2")
    assert run_cli(2, False, str(script), []) == 2
    assert capsys.readouterr().err.splitlines() == [
        "dlcp launch: DLCP_EMULATED_LOSS=2 outside [0, 1)"
    ]
    assert list(tmp_path.iterdir()) == [script]  # no rank ran


def test_dlcp_train_demo_says_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dlcp.cli import main

    monkeypatch.setenv("DLCP_N_PATHS", "0")
    monkeypatch.setenv("DLCP_EMULATED_LOSS", "5")  # (ignored: the demo's loss is --loss)
    assert main(["train-demo", "--results", str(tmp_path)]) == 2
    said = capsys.readouterr().err.splitlines()
    assert said == ["dlcp train-demo: DLCP_N_PATHS=0 outside 1..256"]


def test_an_unreadable_secret_file_is_named_before_any_rank_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``DLCP_JOB_SECRET_FILE`` that names no file passed the launcher's check and
    failed in every rank when it derived its keys: it is one line before any rank."""
    missing = tmp_path / "no-such-secret"
    says = f"DLCP_JOB_SECRET_FILE='{missing}' cannot be read"
    message = check_env({"DLCP_JOB_SECRET_FILE": str(missing)})
    assert message is not None and message.startswith(says)
    script = tmp_path / "rank.py"
    script.write_text("import pathlib, os\npathlib.Path(__file__ + os.environ['RANK']).touch()\n")
    monkeypatch.setenv("DLCP_JOB_SECRET_FILE", str(missing))
    assert run_cli(2, False, str(script), []) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"dlcp launch: {says}")
    assert list(tmp_path.iterdir()) == [script]  # no rank ran


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"DLCP_ENGINE": "fast"}, "DLCP_ENGINE=fast: use 'auto', 'native' or 'python'"),
        ({"DLCP_AUTHENTICATE": "maybe"},
         "DLCP_AUTHENTICATE='maybe' is not a valid bool: "
         "use 1, true, yes, on or 0, false, no, off"),
        ({"DLCP_DEFAULT_FILL": "mean"},
         "DLCP_DEFAULT_FILL='mean' is not a valid fill: use 'zero', 'previous', 'rescale'"),
    ],
)  # fmt: skip
def test_a_refused_value_is_named_first_and_the_accepted_ones_listed(
    env: dict[str, str], says: str
) -> None:
    """``DLCP_ENGINE=fast`` was refused as ``engine='fast' (DLCP_ENGINE)``, the field's
    name before the variable the user typed, and a bad boolean or fill did not say
    what is accepted."""
    assert check_env(env) == says
