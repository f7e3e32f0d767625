"""The kafka-python versions the Kafka edge accepts (its internals are version-specific)."""

from __future__ import annotations

import kafka
import pytest

from service.broker.compat import check_version
from service.errors import ConfigError


def test_the_installed_version_is_accepted() -> None:
    check_version()  # the one pyproject.toml pins
    assert kafka.__version__.startswith("3.0.")


@pytest.mark.parametrize("version", ["3.0.0", "3.0.12", "3.0.99"])
def test_every_3_0_release_is_accepted(version: str) -> None:
    check_version(version)


@pytest.mark.parametrize("version", ["3.1.0", "2.2.15", "4.0.0", "dev"])
def test_another_version_is_refused_with_the_fix(version: str) -> None:
    with pytest.raises(ConfigError) as raised:
        check_version(version)
    message = str(raised.value)
    assert f"kafka-python {version} is installed" in message
    assert "kafka-python>=3.0.12,<3.1" in message
