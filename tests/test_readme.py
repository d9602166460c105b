"""The README stays true: every setting documented, the commands it shows exist."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from atmosphere.config import env_names

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SERVICES = ("governance", "memory", "tape", "sandbox", "dispatch", "ingress")


def test_every_setting_is_documented() -> None:
    documented = set(re.findall(r"^\| `((?:ATMOSPHERE|LLM)_[A-Z_]+)` \|", README, re.M))
    for service in SERVICES:
        module = importlib.import_module(f"atmosphere.{service}.settings")
        names = set(env_names(getattr(module, f"{service.capitalize()}Settings")))
        assert names <= documented, f"undocumented {service} settings: {sorted(names - documented)}"


def test_the_commands_it_shows_exist() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for target in [*re.findall(r"^make ([a-z-]+)", README, re.M), "run", "test", "bench", "proto", "clean"]:
        assert re.search(rf"^{target}:", makefile, re.M), f"README mentions `make {target}`"
    for bench in re.findall(r"`(bench/\w+\.py)`", README):
        assert (ROOT / bench).is_file(), bench
        assert bench in makefile, f"`make bench` does not run {bench}"
    ci = (ROOT / ".ci/run").read_text()
    assert "make test" in ci
