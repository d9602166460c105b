import asyncio
from pathlib import Path

import pytest

from atmosphere.config import ServiceSettings
from atmosphere.service import EXIT_APP_UNLOADABLE, AppLoadError, load_service_app, run


def test_a_missing_module_is_an_app_load_error_naming_the_app(tmp_path: Path) -> None:
    with pytest.raises(AppLoadError, match=r"ATMOSPHERE_APP='does\.not:exist'.*No module named 'does'"):
        load_service_app("does.not:exist", tmp_path)


def test_an_exception_in_the_users_module_is_an_app_load_error_with_its_cause(tmp_path: Path) -> None:
    (tmp_path / "p_broken_agents.py").write_text("undefined_name\n")
    with pytest.raises(AppLoadError, match="NameError: name 'undefined_name' is not defined") as caught:
        load_service_app("p_broken_agents:app", tmp_path)
    assert isinstance(caught.value.__cause__, NameError)


def test_an_attribute_that_is_no_app_is_an_app_load_error(tmp_path: Path) -> None:
    (tmp_path / "p_not_an_app.py").write_text("app = 42\n")
    with pytest.raises(AppLoadError, match=r"p_not_an_app:app is an int, not an atmosphere\.sdk\.App"):
        load_service_app("p_not_an_app:app", tmp_path)


def test_the_process_exits_with_the_unloadable_code_when_the_app_cannot_be_loaded(tmp_path: Path) -> None:
    async def serve(_settings: ServiceSettings, *, stop: asyncio.Event) -> None:
        load_service_app("does.not:exist", tmp_path)

    assert EXIT_APP_UNLOADABLE not in {0, 1, 2, 3, 130}  # distinct from every other outcome of run()
    assert run(serve, ServiceSettings, service="dispatch") == EXIT_APP_UNLOADABLE


async def test_the_health_reports_the_version_of_the_services_own_distribution() -> None:
    from importlib import metadata

    from atmosphere.bus.testing import FakeBus
    from atmosphere.service import Health

    health = Health("dispatch", FakeBus())
    assert health.version == metadata.version("atmosphere-ai-dispatch") != "0+unknown"


def test_a_missing_attribute_is_named_with_the_apps_the_module_has(tmp_path: Path) -> None:
    (tmp_path / "p_typo_agents.py").write_text("from atmosphere.sdk import App\n\napp = App()\n")
    with pytest.raises(AppLoadError) as caught:
        load_service_app("p_typo_agents:apq", tmp_path)
    assert "p_typo_agents has no attribute 'apq'" in str(caught.value)
    assert "its App is 'app'" in str(caught.value)
    assert "NoneType" not in str(caught.value)


def test_an_attribute_that_is_none_says_so_in_plain_words(tmp_path: Path) -> None:
    (tmp_path / "p_none_agents.py").write_text("app = None\n")
    with pytest.raises(AppLoadError) as caught:
        load_service_app("p_none_agents:app", tmp_path)
    assert "p_none_agents:app is None, not an atmosphere.sdk.App" in str(caught.value)
    assert "did you forget `app = App(...)`?" in str(caught.value)
    assert "NoneType" not in str(caught.value)


def test_a_module_without_any_app_says_there_is_none(tmp_path: Path) -> None:
    (tmp_path / "p_empty_agents.py").write_text("x = 1\n")
    with pytest.raises(AppLoadError, match=r"p_empty_agents has no attribute 'app' \(and no App at all\)"):
        load_service_app("p_empty_agents:app", tmp_path)


def test_an_agent_class_named_directly_says_to_list_it_in_an_app(tmp_path: Path) -> None:
    (tmp_path / "p_class_agents.py").write_text(
        "from atmosphere.sdk import App, agent\n\n@agent(name='hi')\nclass Hi:\n    pass\n\napp = App([Hi])\n"
    )
    with pytest.raises(AppLoadError, match=r"p_class_agents:Hi is the class Hi, not an atmosphere\.sdk\.App"):
        load_service_app("p_class_agents:Hi", tmp_path)
