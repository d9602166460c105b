"""Bad arguments get argparse's usage and a one-line error (exit 2), `--help` shows every default, `--version`."""

import sys
from importlib import metadata
from pathlib import Path

import pytest

from atmosphere.cli import __main__ as cli_main
from atmosphere.cli.dev import DevOptions


@pytest.fixture
def never_run(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake_run_dev(options: DevOptions) -> int:
        raise AssertionError(f"bad arguments must not start a stack: {options}")

    monkeypatch.setattr(cli_main, "run_dev", fake_run_dev)


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        cli_main.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: atmosphere")
    assert "Traceback" not in err
    return err


@pytest.mark.usefixtures("never_run")
@pytest.mark.parametrize(
    "flag", ["--http-port", "--nats-port", "--grpc-port", "--probe-base-port", "--model-port", "--nats-cluster-port"]
)
@pytest.mark.parametrize("value", ["99999", "0", "-1", "http"])
def test_a_port_outside_1_to_65535_is_a_usage_error(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(["dev", flag, value], capsys)
    assert f"argument {flag}: " in err
    assert "a port number from 1 to 65535" in err


@pytest.mark.usefixtures("never_run")
def test_ports_counted_up_past_65535_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(["dev", "--probe-base-port", "65533"], capsys)
    assert "--probe-base-port 65533" in err
    assert "65537" in err  # the last of the five probe ports


@pytest.mark.usefixtures("never_run")
def test_two_listeners_on_one_port_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(["dev", "--http-port", "8183", "--probe-base-port", "8181"], capsys)
    assert "port 8183 is both" in err
    assert "ingress's HTTP port (--http-port)" in err
    assert "(--probe-base-port)" in err


@pytest.mark.usefixtures("never_run")
def test_a_missing_app_dir_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(["dev", "--app-dir", str(tmp_path / "nowhere")], capsys)
    assert f"argument --app-dir: {tmp_path / 'nowhere'} is not a directory" in err


@pytest.mark.usefixtures("never_run")
def test_a_home_that_is_a_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("")
    err = refused(["dev", "--home", str(tmp_path / "file")], capsys)
    assert "argument --home: " in err


@pytest.mark.usefixtures("never_run")
def test_an_app_that_is_not_module_colon_attribute_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(["dev", "--app", "examples.assistant"], capsys)
    assert "argument --app: " in err
    assert "module:attribute" in err


def test_dev_help_shows_the_default_of_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main.main(["dev", "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for default in [
        "(default: 4222)",
        "(default: 8080)",
        "(default: 8181)",
        "(default: 50051)",
        "(default: 8090)",
        "(default: 6222)",
        "(default: 8222)",
        "(default: 127.0.0.1)",
        "(default: 1)",
        "(default: .atmosphere)",
    ]:
        assert default in text, default


@pytest.mark.parametrize("command", [["tape", "follow"], ["tape", "export"], ["bus-credentials"], ["new"]])
def test_every_subcommand_help_shows_defaults_without_repeating_them(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main.main([*command, "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in text  # an option whose help says its default in words keeps just those
    if command == ["tape", "export"]:
        assert "(default: 0, all)" in text


def test_version_prints_the_installed_cli_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"atmosphere {metadata.version('atmosphere-ai-cli')}"


@pytest.mark.usefixtures("never_run")
@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("crewai", "must look like RUNTIME=PYTHON"),
        ("Crew AI=/usr/bin/python3", "must look like RUNTIME=PYTHON"),
        ("crewai=", "must look like RUNTIME=PYTHON"),
        ("crewai=/no/such/python", "is not an executable file"),
    ],
)
def test_a_pool_interpreter_must_be_a_runtime_and_an_executable(
    value: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert said in refused(["dev", "--pool-python", value], capsys)


def test_a_pool_interpreter_reaches_the_options() -> None:
    args = cli_main._parser().parse_args(["dev", "--pool-python", f"crewai={sys.executable}"])
    assert cli_main._dev_options(args).pool_python == (("crewai", str(Path(sys.executable).absolute())),)
