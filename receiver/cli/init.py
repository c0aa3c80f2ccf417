"""``receiver init``: write a commented config with a fresh webhook secret.

The file ends with a commented-out http sink that signs the Standard Webhooks way, with a fresh
secret already in the ``whsec_<base64>`` form that scheme needs, to hand to the consumer.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from receiver.cli.common import CommandError
from receiver.config.render import render_config
from receiver.config.settings import config_path
from receiver.signature import new_standard_webhooks_secret

_STANDARD_WEBHOOKS_SINK = """
# An http sink for a consumer using the ecosystem's formats (docs/consumers.md): a CloudEvents
# event signed the Standard Webhooks way. The secret below was made for it (whsec_ + base64 of
# 32 random bytes, the form that signing needs); give it to the consumer. Set url and uncomment.
# [[sinks]]
# name = "consumer"
# type = "http"
# url = "https://consumer.example/hooks/receiver"
# signing = "standard-webhooks"
# secret = "{secret}"
# envelope = "cloudevents"
"""


def config_text() -> str:
    """What ``init`` writes: the rendered config and the commented Standard Webhooks sink."""
    return render_config() + _STANDARD_WEBHOOKS_SINK.format(secret=new_standard_webhooks_secret())


def add_parser(commands: Any) -> None:
    init = commands.add_parser(
        "init",
        help="write a commented config with a fresh webhook secret",
        description="Write a config file (default: $RECEIVER_CONFIG, then ./config.toml) with "
        "every key at its default and one line of help, a fresh random webhook secret (the file "
        "is created readable by its owner only), the local simulator as the upstream API and a "
        "download sink. An existing file is kept unless --force.",
    )
    init.add_argument("--config", metavar="PATH", help="where to write it")
    init.add_argument("--force", action="store_true", help="replace an existing file")


def run(args: argparse.Namespace) -> int:
    path = config_path(args.config)
    text = config_text()
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if args.force else os.O_EXCL)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise CommandError(
            f"{path} already exists; keep it, or pass --force to replace it (with a new secret)"
        ) from None
    except OSError as exc:
        raise CommandError(f"{path}: cannot be written ({exc.strerror})") from None
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    os.chmod(path, 0o600)  # --force on an existing file keeps its mode otherwise
    where = "" if Path(path) == Path("config.toml") else f" --config {path}"
    print(f"wrote {path}: a local set-up with a fresh webhook secret (readable only by you)")
    print(f"next: receiver check-config{where}, then receiver serve{where}")
    return 0
