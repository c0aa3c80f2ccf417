"""`receiver init`'s config: every key of the schema with its default and help, a fresh secret."""

from __future__ import annotations

import tomllib

from receiver.config.load import parse_settings
from receiver.config.render import render_config, toml_value
from receiver.config.schema import Key
from receiver.config.settings import schema


def table_keys() -> list[Key]:
    """The keys of the [sections] (arrays of tables are optional: not in the rendered file)."""
    return [k for section in schema() if not section.many for k in section.keys.values()]


def test_the_rendered_config_loads_and_keeps_every_default() -> None:
    text = render_config()
    settings = parse_settings(tomllib.loads(text), env={})
    for k in table_keys():
        if k.path != "webhook.secrets":
            assert getattr(getattr(settings, k.section), k.name) == k.default, k.path
    assert [s.name for s in settings.sinks] == ["files"]
    assert settings.sinks[0].options["allow_private_networks"] is True


def test_every_key_appears_with_its_help() -> None:
    text = render_config()
    lines = text.splitlines()
    for k in table_keys():
        section = next(i for i, line in enumerate(lines) if line.startswith(f"[{k.section}]"))
        at = next(
            i for i, line in enumerate(lines) if i > section and line.startswith(f"{k.name} = ")
        )
        beside, above = lines[at], lines[at - 1]
        assert k.help in beside or k.help in above, k.path


def test_each_config_gets_its_own_strong_secret() -> None:
    secrets = {
        parse_settings(tomllib.loads(render_config()), env={}).webhook.secrets for _ in range(3)
    }
    assert len(secrets) == 3
    for (secret,) in secrets:
        assert secret.startswith("whsec_") and len(secret) >= 40
    assert 'secrets = ["whsec_given"]' in render_config(secret="whsec_given")


def test_toml_values() -> None:
    data = {"a": 'x"y\\z', "b": (1, 2.5), "c": {"k": "v"}, "d": False}
    text = "\n".join(f"{k} = {toml_value(v)}" for k, v in data.items())
    assert tomllib.loads(text) == {"a": 'x"y\\z', "b": [1, 2.5], "c": {"k": "v"}, "d": False}
