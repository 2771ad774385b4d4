"""One attempt of a remote request, whatever carries it: HTTP (httpx) or gRPC.

:class:`~pyflink_aisp.inference.handlers.remote.RemoteSession` owns the retries, the
deadline and the adaptive limit; a :class:`Sender` makes one attempt and either raises
:class:`NoAnswer` (nothing came back: a timeout, a refused or reset connection) or returns a
:class:`Reply` that says its status in HTTP terms (gRPC codes are mapped to the HTTP status
``google/rpc/code.proto`` names for each), any ``Retry-After`` it carried, and, once the
session decides the status is final, the parsed answer or the error it is.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["BODY_CHARS", "NoAnswer", "Reply", "Sender"]

#: Most characters of an error body kept in a message.
BODY_CHARS = 300


class NoAnswer(Exception):
    """An attempt that got no answer.

    Attributes:
        text: What happened (never the request's headers or metadata).
        timed_out: The attempt ran out of time (a slow server), as opposed to a connection
            that was refused or reset.
    """

    def __init__(self, text: str, *, timed_out: bool) -> None:
        super().__init__(text)
        self.text = text
        self.timed_out = timed_out


class Reply(Protocol):
    """An answer of one attempt."""

    @property
    def status(self) -> int:
        """The HTTP status (for gRPC: the code's HTTP equivalent)."""
        ...

    @property
    def retry_after_s(self) -> float | None:
        """Seconds the server asked to wait (``Retry-After``), or None."""
        ...

    def summary(self) -> str:
        """One line for a retry's "last:" message, e.g. ``HTTP 503: busy``."""
        ...

    def answer(self) -> Any:
        """The parsed answer (a JSON-shaped value).

        Raises:
            RemoteError: A 4xx / 5xx, or a body that is not the protocol's.
            PromptTooLongError: The server's "the prompt is past the context window".
        """
        ...


class Sender(Protocol):
    """Makes one attempt on the session's event loop."""

    async def send(self, path: str, body: Any, timeout_s: float) -> Reply:
        """Send ``body`` to ``path`` within ``timeout_s`` seconds.

        Raises:
            NoAnswer: Nothing came back.
        """
        ...

    async def aclose(self) -> None:
        """Close the connections."""
        ...
