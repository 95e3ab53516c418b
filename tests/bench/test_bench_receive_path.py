"""dlcp.bench.receive_path: both receive paths take the same replayed buffers (a
message that did not arrive exact fails the run), and the figures are per run
length, per datagram, with the ratio of the two."""

import json

import pytest

from dlcp.bench import receive_path
from dlcp.io import native_receive

pytestmark = pytest.mark.skipif(
    not native_receive.available(), reason="the native receive path was not built"
)


def test_figures_per_run_length(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--messages", "3", "--elems", "5000", "--runs", "1,7", "--repeats", "2",
            "--copy-elems", "400000", "--json"]  # fmt: skip
    assert receive_path.main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    copy = result["copy"]  # (400,000 float32: 1,112 datagrams, one run of 1,024 taken twice)
    assert copy["datagrams"] == 1024 and copy["new_ns"] > 0 and copy["duplicate_ns"] > 0
    assert result["bench"] == "receive_path" and result["datagrams"] > 3
    assert set(result["runs"]) == {"1", "7"}
    for fig in result["runs"].values():
        assert fig["python_ns"] > 0 and fig["native_ns"] > 0
        assert fig["ratio"] == pytest.approx(fig["native_ns"] / fig["python_ns"], rel=0.01)


@pytest.mark.skipif(not native_receive.verifies_tags(), reason="built without libcrypto")
def test_tagged_datagrams_are_verified_on_both_paths(capsys: pytest.CaptureFixture[str]) -> None:
    """--authenticate: both paths take tagged datagrams (exact messages on both, or
    the run fails), the native one verifying them in C."""
    argv = ["--messages", "2", "--elems", "5000", "--runs", "1,16", "--repeats", "2",
            "--copy-elems", "400000", "--authenticate", "--json"]  # fmt: skip
    assert receive_path.main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert result["authenticated"] is True and set(result["runs"]) == {"1", "16"}
    assert "tagged (AES-GMAC)" in "\n".join(out)


def test_a_path_that_loses_a_message_fails_the_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # a table that takes nothing and hands nothing back: the messages never complete
    monkeypatch.setattr(receive_path, "hand_over", lambda *a: None)
    argv = ["--messages", "2", "--elems", "3000", "--runs", "4", "--copy-elems", "400000"]
    assert receive_path.main(argv) == 1
    assert "native path, runs of 4: 0 of 2 messages arrived exact" in capsys.readouterr().err


def test_bad_arguments_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        receive_path.main(["--runs", "0,4"])
    assert "argument --runs: '0,4'" in capsys.readouterr().err
