import textwrap
from pathlib import Path

import pytest

from receiver.config.load import load_settings, parse_settings
from receiver.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = {"webhook": {"secrets": ["s3cret-value"]}}


def problems_of(data, env=None):
    with pytest.raises(ConfigError) as err:
        parse_settings(data, env=env or {})
    return err.value.problems


def test_example_config_is_valid():
    settings = load_settings(ROOT / "config.example.toml", env={})
    assert settings.server.path == "/webhooks"
    assert settings.store.synchronous == "full"
    assert [s.name for s in settings.sinks] == ["files"]
    assert settings.sinks[0].options["allow_private_networks"] is True


def test_defaults_follow_the_contract():
    s = parse_settings(MINIMAL, env={})
    assert (s.server.port, s.server.max_body_bytes, s.webhook.tolerance_seconds) == (
        8080,
        1048576,
        300,
    )
    assert (s.admin.host, s.admin.port) == ("127.0.0.1", 9091)
    assert (s.worker.concurrency, s.worker.max_attempts) == (8, 12)
    assert s.store.retention_hours == 168


def test_environment_supplies_secrets():
    s = parse_settings(
        {},
        env={
            "RECEIVER_WEBHOOK_SECRETS": "a-secret, b-secret ,",
            "RECEIVER_API_KEY": "service_" + "0" * 64,
            "RECEIVER_ADMIN_TOKEN": "tok",
        },
    )
    assert s.webhook.secrets == ("a-secret", "b-secret")
    assert s.api.api_key.startswith("service_")
    assert s.admin.token == "tok"


def test_every_problem_is_reported_with_its_key():
    problems = problems_of(
        {
            "server": {"port": "eighty", "colour": "red"},
            "store": {"retention_hours": 24, "synchronous": "off"},
            "worker": {"concurrency": 0},
            "webhook": {"secrets": ["x"], "tolerance_seconds": True},
            "extra": {},
        }
    )
    text = "\n".join(problems)
    for key in (
        "server.port",
        "server.colour: unknown key",
        "store.retention_hours: must be >= 48",
        "store.synchronous",
        "worker.concurrency",
        "webhook.tolerance_seconds",
        "extra: unknown section",
    ):
        assert key in text


def test_no_secret_at_all_is_an_error():
    assert any("webhook.secrets" in p for p in problems_of({}))


def test_sink_problems_name_the_sink():
    problems = problems_of(
        {
            **MINIMAL,
            "sinks": [
                {"name": "a", "type": "download", "directory": 5, "colour": "x"},
                {"name": "b", "type": "carrier-pigeon"},
                {"type": "download"},
                {"name": "a", "type": "download", "max_attempts": 0},
            ],
        }
    )
    text = "\n".join(problems)
    assert "sinks.a.directory: must be a string" in text
    assert "sinks.a.colour: not a key of download sinks" in text
    assert "sinks.b.type: unknown sink type 'carrier-pigeon'" in text
    assert "sinks[2].name: missing" in text
    assert "sinks.a: sink name used twice" in text
    assert "sinks.a.max_attempts: must be at least 1" in text


def test_sink_filters_and_defaults():
    s = parse_settings(
        {
            **MINIMAL,
            "sinks": [
                {
                    "name": "f",
                    "type": "download",
                    "events": ["job.completed"],
                    "job_types": ["logo"],
                }
            ],
        },
        env={},
    )
    sink = s.sinks[0]
    assert sink.wants_event("job.completed") and not sink.wants_event("job.failed")
    assert sink.wants_job_type("logo") and not sink.wants_job_type("animation")
    assert sink.options["directory"] == "data/downloads"
    assert s.sink_max_attempts(sink) == 12


@pytest.mark.parametrize(
    "content,needle",
    [
        ("[server\nport=1", "not valid TOML"),
        ("\xff\xfe", "not UTF-8"),
    ],
)
def test_unreadable_files(tmp_path, content, needle):
    path = tmp_path / "c.toml"
    path.write_bytes(content.encode("latin-1"))
    with pytest.raises(ConfigError) as err:
        load_settings(path, env={})
    assert needle in err.value.message


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_settings(tmp_path / "nope.toml", env={})
    assert err.value.problems == [
        f"config file {tmp_path / 'nope.toml'} not found "
        "(`receiver init` writes one; --config PATH names another)"
    ]


def test_toml_file_round_trip(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        textwrap.dedent("""
        [webhook]
        secrets = ["abc12345"]
        [server]
        trusted_proxies = ["10.0.0.0/8"]
        shutdown_timeout_seconds = 3
    """)
    )
    s = load_settings(path, env={})
    assert s.server.trusted_proxies == ("10.0.0.0/8",)
    assert s.server.shutdown_timeout_seconds == 3.0
