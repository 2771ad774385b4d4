"""Prompts counted before they are sent (``--prompt-max-tokens``): a prompt over the limit is a
``prompt_too_long`` dead letter, or its text is cut from the end until it fits; never sent as it is.

A record's prompt (the template with its text) is counted in tokens by a local HF
``tokenizer.json`` (:class:`~pyflink_aisp.tokenize.ArrowTokenizer`, without special tokens) or
by the server's own ``POST /tokenize``: llama.cpp's takes ``{"content"}`` and answers
``{"tokens": [...]}`` (tools/server/server-context.cpp, ``post_tokenize``), vLLM's takes
``{"model", "prompt"}`` and answers ``{"tokens", "count", "max_model_len"}``; both fields are
sent and each server reads its own. The servers take one text per request, so a batch's counts
go as one request per distinct prompt, all in flight at once.

Truncation (``truncate``) keeps the template whole and cuts only the record's ``{text}`` (a
second ``{text_pair}`` and the prompt fields are kept): the prompt with an empty text is counted
first (over the limit: no text can fit, a dead letter), then the longest prefix of the text whose
prompt fits is searched by interpolation between a prefix known to fit and one known not to, each round one
count per record still open (batched), at most :data:`MAX_ROUNDS` rounds; the prefix kept was
counted and fits. What is counted is the prompt's text: the chat template a server wraps a
conversation in, the system prompt and special tokens are not, so leave them room.

Thread-safety: the counters are called from the handler's batching thread only.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyflink_aisp.errors import ConfigError, PromptTooLongError, RemoteError
from pyflink_aisp.inference.handlers.remote._client import RemoteEndpoint, RemoteSession
from pyflink_aisp.tokenize import ArrowTokenizer, TokenizerConfig

__all__ = ["MAX_ROUNDS", "Fitted", "PromptLimit", "PromptOverflow", "TokenCounter", "check_tokenize",
           "fit_prompts", "prompt_counter", "tokenize_body"]

#: Most counting rounds spent cutting one batch's texts.
MAX_ROUNDS = 16

#: Token counts of texts, in order (a server's failure to count one: its error).
TokenCounter = Callable[[list[str]], list["int | RemoteError"]]


class PromptOverflow(enum.StrEnum):
    """What happens to a prompt over the limit (``--prompt-overflow``)."""

    DEAD_LETTER = "dead-letter"  # a prompt_too_long dead letter
    TRUNCATE = "truncate"  # its text cut from the end until the prompt fits


@dataclass(frozen=True, kw_only=True)
class PromptLimit:
    """How prompts are counted, and what happens to one that does not fit.

    Attributes:
        max_tokens: Most tokens of a prompt.
        overflow: Dead-letter it or cut its text.
        tokenizer: A HF ``tokenizer.json`` (or a directory holding one) to count with; None: the
            server's ``POST /tokenize``.

    Raises:
        ConfigError: ``max_tokens`` < 1, an unknown ``overflow``, a tokenizer that is not a file.
    """

    max_tokens: int
    overflow: PromptOverflow = PromptOverflow.DEAD_LETTER
    tokenizer: Path | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "overflow", PromptOverflow(self.overflow))
        except ValueError:
            raise ConfigError(f"prompt overflow must be one of {[o.value for o in PromptOverflow]}, got "
                              f"{self.overflow!r}") from None
        if self.max_tokens < 1:
            raise ConfigError(f"the most prompt tokens must be >= 1, got {self.max_tokens}")
        if self.tokenizer is not None:
            path = Path(self.tokenizer)
            file = path / "tokenizer.json" if path.is_dir() else path
            if not file.is_file():
                raise ConfigError(f"the prompt tokenizer {path} is not a tokenizer.json (or a directory "
                                  "holding one)")
            object.__setattr__(self, "tokenizer", file)


@dataclass(frozen=True)
class Fitted:
    """A prompt that fits: the example to send (its text cut when ``truncated``)."""

    example: Any
    truncated: bool


def tokenize_body(model: str, text: str) -> dict[str, Any]:
    """The ``POST /tokenize`` body for llama.cpp and vLLM alike (no special tokens)."""
    return {"model": model, "content": text, "prompt": text, "add_special": False,
            "add_special_tokens": False}


def _token_count(answer: Any) -> int:
    """The length of a ``/tokenize`` answer's ``tokens``.

    Raises:
        RemoteError: No ``tokens`` list (status None).
    """
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(tokens, list):
        raise RemoteError(f"/tokenize answered without a tokens list: {str(answer)[:200]!r}")
    return len(tokens)


def check_tokenize(endpoint: RemoteEndpoint, model: str) -> None:
    """The health check of counting by the server: ``POST /tokenize`` answers a tokens list.

    Raises:
        RemoteError: In one line, when it does not (unreachable, 404, another answer).
    """
    try:
        _token_count(endpoint.post_json("/tokenize", tokenize_body(model, "Hello")))
    except RemoteError as exc:
        raise RemoteError(f"{endpoint.url}/tokenize does not count tokens ({str(exc)[:200]}): "
                          "--prompt-tokenizer server needs a server with POST /tokenize (llama.cpp, vLLM); "
                          "give --prompt-tokenizer PATH to the model's tokenizer.json instead",
                          exc.status) from None


def prompt_counter(limit: PromptLimit, session: RemoteSession, model: str) -> TokenCounter:
    """The counter of ``limit``: its tokenizer (loaded now), or the server's ``/tokenize`` through
    ``session`` (one request per text, all in flight).

    Raises:
        ModelError: The tokenizer cannot be loaded.
    """
    if limit.tokenizer is not None:
        tokenizer = ArrowTokenizer.from_file(limit.tokenizer, TokenizerConfig(max_length=None,
                                                                             add_special_tokens=False))

        def local(texts: list[str]) -> list[int | RemoteError]:
            lengths = tokenizer.encode(texts).input_ids.value_lengths()
            return [int(n) for n in lengths.to_pylist()]
        return local

    def served(texts: list[str]) -> list[int | RemoteError]:
        answers = session.gather([("/tokenize", tokenize_body(model, t)) for t in texts])
        out: list[int | RemoteError] = []
        for answer in answers:
            try:
                out.append(answer if isinstance(answer, RemoteError) else _token_count(answer))
            except RemoteError as exc:
                out.append(exc)
        return out
    return served


def _counted(count: TokenCounter, texts: list[str]) -> list[int | RemoteError]:
    """``count`` over the distinct texts only."""
    unique = list(dict.fromkeys(texts))
    found = dict(zip(unique, count(unique) if unique else [], strict=True))
    return [found[t] for t in texts]


def _cut(example: Any, chars: int) -> Any:
    """The example with its text cut to ``chars`` characters (a pair's second text and the prompt
    fields kept)."""
    if isinstance(example, dict):
        return {**example, "text": example["text"][:chars]}
    return (example[0][:chars], example[1]) if isinstance(example, tuple) else example[:chars]


def _text_of(example: Any) -> str:
    """The text an example's truncation cuts."""
    if isinstance(example, dict):
        return str(example["text"])
    return str(example[0] if isinstance(example, tuple) else example)


@dataclass
class _Search:
    """One text being cut: ``lo`` characters fit (``c_lo`` tokens), ``hi`` do not (``c_hi``)."""

    row: int
    lo: int
    c_lo: int
    hi: int
    c_hi: int

    def open(self) -> bool:
        return self.hi - self.lo > 1 and self.c_hi - self.c_lo > 1

    def probe(self, cap: int) -> int:
        """The next prefix to count: interpolated where the prompt would hold ``cap`` tokens, at
        least 1/16 of the span inside it (so the span shrinks every round)."""
        span = self.hi - self.lo
        guess = self.lo + round(span * (cap - self.c_lo) / (self.c_hi - self.c_lo))
        margin = max(1, span // 16)
        return min(max(guess, self.lo + margin), self.hi - margin)


def fit_prompts(examples: Sequence[Any], limit: PromptLimit, count: TokenCounter,
                prompt: Callable[[Any], str]) -> list[Fitted | RemoteError]:
    """Each example's prompt counted and fitted to ``limit`` (see the module docstring).

    Args:
        examples: Texts, ``(text, text_pair)`` tuples, or dicts of prompt fields holding ``text``.
        limit: The limit and the overflow mode.
        count: Token counts of prompts.
        prompt: An example's prompt (the template with its texts).

    Returns:
        Per example, in order: :class:`Fitted`, a
        :class:`~pyflink_aisp.errors.PromptTooLongError` (over the limit with ``dead-letter``, or
        not even its template fits), or the :class:`~pyflink_aisp.errors.RemoteError` of a
        server that did not count it.
    """
    cap = limit.max_tokens
    out: list[Fitted | RemoteError | None] = []
    over: list[tuple[int, int]] = []
    for i, (x, n) in enumerate(zip(examples, _counted(count, [prompt(x) for x in examples]), strict=True)):
        if isinstance(n, RemoteError) or n <= cap:
            out.append(n if isinstance(n, RemoteError) else Fitted(x, False))
        elif limit.overflow is PromptOverflow.DEAD_LETTER:
            out.append(PromptTooLongError(f"the prompt is {n} tokens, over --prompt-max-tokens {cap}"))
        else:
            out.append(None)
            over.append((i, n))
    searches: list[_Search] = []
    empties = _counted(count, [prompt(_cut(examples[i], 0)) for i, _ in over])
    for (i, n), e in zip(over, empties, strict=True):
        if isinstance(e, RemoteError) or e > cap:
            out[i] = e if isinstance(e, RemoteError) else PromptTooLongError(
                f"the prompt is {n} tokens, over --prompt-max-tokens {cap}, and {e} without any text: no "
                "part of the text fits (shorten --prompt-template)")
        else:
            searches.append(_Search(i, 0, e, len(_text_of(examples[i])), n))
    for _ in range(MAX_ROUNDS):
        todo = [s for s in searches if s.open() and out[s.row] is None]
        if not todo:
            break
        probes = [s.probe(cap) for s in todo]
        for s, k, c in zip(todo, probes, _counted(count, [prompt(_cut(examples[s.row], k))
                                                          for s, k in zip(todo, probes, strict=True)]),
                           strict=True):
            if isinstance(c, RemoteError):
                out[s.row] = c
            elif c <= cap:
                s.lo, s.c_lo = k, c
            else:
                s.hi, s.c_hi = k, c
    for s in searches:
        if out[s.row] is None:
            out[s.row] = Fitted(_cut(examples[s.row], s.lo), True)
    done: list[Fitted | RemoteError] = []
    for o in out:
        assert o is not None  # every row ended above
        done.append(o)
    return done
