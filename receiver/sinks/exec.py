"""The ``exec`` sink: a local command run for each event, the enriched JSON on its stdin.

``command`` is an argv list, run without a shell, so nothing from the event can become shell
syntax. The command sees ``RECEIVER_EVENT_ID``, ``RECEIVER_EVENT``, ``RECEIVER_JOB_ID`` and
``RECEIVER_JOB_TYPE`` in its environment, plus the sink's ``env`` table, on top of the receiver's
environment minus its own ``RECEIVER_*`` variables (they hold the receiver's secrets). It runs in
a new session (its own process group) in ``cwd`` if set; stdout is discarded.

Exit status 0 is success. A non-zero status, a death by signal, or running past the sink's
``timeout_seconds`` is a failed attempt whose error ends with the tail of the command's stderr;
on a timeout (or when the receiver gives up on the attempt) the whole process group is killed,
so no child is left behind. A command that does not exist or is not executable is dead at once.

With ``envelope = "cloudevents"``, stdin is the CloudEvent in the JSON event format instead
(:mod:`receiver.outbound.envelopes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping

from receiver.config.settings import SinkSettings
from receiver.errors import PermanentError, TransientError
from receiver.events import Enriched
from receiver.outbound.envelopes import Envelope
from receiver.sinks.base import SinkContext

STDERR_TAIL_BYTES = 2000
READ_CHUNK = 4096
# After the command exits, how long its stderr may stay open (a background child holding it).
STDERR_GRACE_SECONDS = 1.0
_OWN_PREFIX = "RECEIVER_"


def child_environment(
    parent: Mapping[str, str], extra: Mapping[str, str], enriched: Enriched
) -> dict[str, str]:
    """The command's environment: the parent's without ``RECEIVER_*``, ``extra``, the event."""
    env = {k: v for k, v in parent.items() if not k.startswith(_OWN_PREFIX)}
    env.update(extra)
    env.update(
        RECEIVER_EVENT_ID=enriched.event_id,
        RECEIVER_EVENT=enriched.event_name,
        RECEIVER_JOB_ID=enriched.job_id,
        RECEIVER_JOB_TYPE=enriched.job_type or "",
    )
    if enriched.traceparent is not None:
        env["TRACEPARENT"] = enriched.traceparent
    return env


def command_limit(timeout: float) -> float:
    """The command's own time limit: a little under the attempt's, so that the sink, not the
    worker's timeout, ends it and the error can carry its stderr."""
    return timeout - min(1.0, timeout * 0.1)


async def _keep_tail(stream: asyncio.StreamReader, tail: bytearray) -> None:
    while chunk := await stream.read(READ_CHUNK):
        tail.extend(chunk)
        del tail[:-STDERR_TAIL_BYTES]


async def _feed(stdin: asyncio.StreamWriter, data: bytes) -> None:
    try:
        stdin.write(data)
        await stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass  # a command that does not read its stdin is not an error in itself
    finally:
        stdin.close()


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _tail_text(tail: bytearray) -> str:
    text = tail.decode("utf-8", "replace").strip()
    return text if text else "(nothing on stderr)"


class ExecSink:
    """Runs ``command`` per event. Options: ``command``, ``env``, ``cwd``, ``envelope``,
    ``cloudevents_source``."""

    def __init__(self, settings: SinkSettings) -> None:
        options = settings.options
        self.name = settings.name
        self.settings = settings
        self.command = [str(arg) for arg in options["command"]]
        self._env = {str(k): str(v) for k, v in (options.get("env") or {}).items()}
        self._cwd = options.get("cwd")
        self._envelope = Envelope(options)

    async def open(self) -> None:
        """Nothing to open."""

    async def close(self) -> None:
        """Nothing to close."""

    async def send(self, enriched: Enriched) -> None:
        """Run the command once; raise a DeliveryError unless it exits with status 0."""
        program = self.command[0]
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env=child_environment(os.environ, self._env, enriched),
                cwd=self._cwd,
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            missing = program if exc.filename in (None, program) else exc.filename
            raise PermanentError(f"{missing}: no such file or directory") from None
        except PermissionError:
            raise PermanentError(f"{program}: permission denied (not executable?)") from None
        except OSError as exc:
            raise TransientError(f"{program} could not be started: {exc.strerror}") from None
        assert proc.stdin is not None and proc.stderr is not None
        tail = bytearray()
        reader = asyncio.create_task(_keep_tail(proc.stderr, tail))
        feeder = asyncio.create_task(_feed(proc.stdin, self._envelope.structured(enriched)))
        limit = command_limit(self.settings.timeout_seconds)
        timed_out = False
        try:
            try:
                async with asyncio.timeout(limit):
                    await proc.wait()
            except TimeoutError:
                timed_out = True
        finally:
            # Also on cancellation (the receiver stopping or giving up): leave nothing running.
            if proc.returncode is None:
                _kill_group(proc.pid)
                await asyncio.shield(proc.wait())
            feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feeder
            await asyncio.wait([reader], timeout=STDERR_GRACE_SECONDS)
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        if timed_out:
            raise TransientError(
                f"{program} timed out after {limit:g} s and its process group was killed; "
                f"stderr: {_tail_text(tail)}"
            )
        code = proc.returncode
        if code == 0:
            return
        if code is not None and code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with status {code}"
        raise TransientError(f"{program} {how}; stderr: {_tail_text(tail)}")


def create(settings: SinkSettings, context: SinkContext) -> ExecSink:
    return ExecSink(settings)
