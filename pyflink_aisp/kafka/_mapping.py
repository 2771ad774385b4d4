"""How a record value is read (JSON or raw UTF-8 text), where its text and id are, and which of
its fields the output keeps.

Paths are JSON Pointers (RFC 6901): ``/body``, ``/review/text``, ``/items/0``; ``~1``
stands for ``/`` and ``~0`` for ``~`` inside a name; an array index is a non-negative
integer without leading zeros. The empty pointer (the whole value) is not a field and
is refused.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pyflink_aisp.errors import ConfigError

__all__ = ["DEFAULT_MAPPING", "KEY_ID", "PROMPT_TEXT_NAMES", "FieldMapping", "ValueFormat", "parse_pointer",
           "resolve_pointer"]

#: Output field names a kept field may not take (the output's own).
_RESERVED = frozenset({"id", "model_sha256"})
#: Placeholder names a prompt field may not take (the record's texts fill them).
PROMPT_TEXT_NAMES = frozenset({"text", "text_pair"})
_MISSING = object()


class ValueFormat(enum.StrEnum):
    """How a record value is read (``--value-format``)."""

    JSON = "json"  # a UTF-8 JSON object; fields by JSON Pointer
    RAW = "raw"    # the value is the text (UTF-8); the id is the record's coordinates
    AVRO = "avro"  # the Confluent wire format (schema id + Avro binary); fields by JSON Pointer


def parse_pointer(pointer: str) -> tuple[str, ...]:
    """``/a/b~1c`` → ``("a", "b/c")`` (RFC 6901 section 3 and 4).

    Raises:
        ConfigError: Not a pointer to a field: empty, not starting with ``/``, or a ``~``
            not followed by ``0`` or ``1``.
    """
    if not pointer.startswith("/"):
        raise ConfigError(f"{pointer!r} is not a JSON Pointer to a field (RFC 6901): it must start with '/', "
                          "e.g. /body or /review/text")
    tokens = []
    for raw in pointer[1:].split("/"):
        stripped = raw.replace("~0", "").replace("~1", "")
        if "~" in stripped:
            raise ConfigError(f"{pointer!r}: '~' must be followed by 0 or 1 (RFC 6901 section 3)")
        tokens.append(raw.replace("~1", "/").replace("~0", "~"))
    return tuple(tokens)


def resolve_pointer(doc: Any, tokens: Sequence[str]) -> Any:
    """The value at ``tokens`` in ``doc``, or :data:`_MISSING` (RFC 6901 section 4: a token
    indexes an array only as a non-negative integer without leading zeros)."""
    value = doc
    for token in tokens:
        if isinstance(value, dict):
            if token not in value:
                return _MISSING
            value = value[token]
        elif isinstance(value, list):
            if not token.isdigit() or (len(token) > 1 and token[0] == "0") or int(token) >= len(value):
                return _MISSING
            value = value[int(token)]
        else:
            return _MISSING
    return value


def is_missing(value: Any) -> bool:
    """Whether :func:`resolve_pointer` found nothing."""
    return value is _MISSING


#: ``--id-field key``: the id is the record's Kafka key.
KEY_ID = "key"


@dataclass(frozen=True, kw_only=True)
class FieldMapping:
    """Where the text and the id of a JSON record are, and the fields the output keeps.

    Attributes:
        text: JSON Pointer to the text (a string). The parsed ``text_path``, ``id_path``,
            ``text_pair_path`` and ``keep_paths`` are set from the pointers.
        text_pair: JSON Pointer to a second text (a string) for pair models (cross-encoders,
            NLI): the model gets ``(text, text_pair)``; None: one text.
        id: JSON Pointer to the id (a non-empty string or an integer); ``"key"``: the
            record's Kafka key (UTF-8); absent, null (or no key) or None here: the record's
            ``topic/partition/offset``.
        keep: JSON Pointers of fields copied unchanged into the output, each under its
            last token's name (``/meta/lang`` → ``lang``), null where the record has none;
            ``("*",)``: every top-level field of each record except the text's, the second
            text's and the id's own (and ``id`` / ``model_sha256``), in the record's order.
        value_format: JSON objects, or raw UTF-8 text (the whole value is the text, the id
            the record's coordinates, nothing to keep).
        features: JSON Pointers of a numeric model's input instead of a text: one pointer to
            an array of numbers, or several pointers to one number each (their order is the
            vector's); empty: the record has a text.
        schema_registry_url: With Avro values: the Confluent-compatible Schema Registry that
            serves their schemas by id (required then, refused otherwise).
        prompt_fields: JSON Pointers of fields a generation's prompt template names besides the
            text, each the placeholder ``{name}`` of its last token (``/meta/product`` →
            ``{product}``); the model then gets a mapping of placeholder name → value
            (:attr:`~pyflink_aisp.kafka.DecodedRecord.model_input`).

    Raises:
        ConfigError: A pointer is not one (:func:`parse_pointer`), two kept fields share a
            name, a kept name is ``id`` or ``model_sha256``, raw values with a text
            field, a second text, kept fields or features, or a second text with features.
    """

    text: str = "/text"
    id: str | None = "/id"
    text_pair: str | None = None
    keep: tuple[str, ...] = ()
    value_format: ValueFormat = ValueFormat.JSON
    features: tuple[str, ...] = ()
    schema_registry_url: str | None = None
    prompt_fields: tuple[str, ...] = ()
    text_path: tuple[str, ...] = field(init=False, repr=False, compare=False)
    text_pair_path: tuple[str, ...] | None = field(init=False, repr=False, compare=False)
    id_path: tuple[str, ...] | None = field(init=False, repr=False, compare=False)
    keep_paths: tuple[tuple[str, ...], ...] = field(init=False, repr=False, compare=False)
    feature_paths: tuple[tuple[str, ...], ...] = field(init=False, repr=False, compare=False)
    prompt_paths: tuple[tuple[str, ...], ...] = field(init=False, repr=False, compare=False)
    feature_only_names: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keep", tuple(self.keep))
        object.__setattr__(self, "prompt_fields", tuple(self.prompt_fields))
        object.__setattr__(self, "features", tuple(self.features))
        object.__setattr__(self, "value_format", ValueFormat(self.value_format))
        if self.value_format is ValueFormat.RAW and (self.text != "/text" or self.keep or self.features
                                                     or self.text_pair is not None):
            raise ConfigError("raw values are the text itself: --text-field, --text-pair-field, "
                              "--keep-fields and --feature-fields apply to json and avro values only")
        if self.text_pair is not None and self.features:
            raise ConfigError("--text-pair-field is a text model's second text: a model of "
                              "--feature-fields reads no text")
        object.__setattr__(self, "feature_paths", tuple(parse_pointer(p) for p in self.features))
        self._set_prompt_paths()
        avro = self.value_format is ValueFormat.AVRO
        if avro != (self.schema_registry_url is not None):
            raise ConfigError("avro values need --schema-registry-url (their schemas come from it), and "
                              "only they: give both or neither")
        if avro and not str(self.schema_registry_url).startswith(("http://", "https://")):
            raise ConfigError("--schema-registry-url must be an http(s) URL, e.g. "
                              "http://127.0.0.1:8081 (Apicurio: http://HOST:PORT/apis/ccompat/v7)")
        object.__setattr__(self, "text_path", parse_pointer(self.text))
        object.__setattr__(self, "text_pair_path",
                           None if self.text_pair is None else parse_pointer(self.text_pair))
        object.__setattr__(self, "id_path", None if self.id in (None, KEY_ID) else parse_pointer(self.id))
        if "*" in self.keep and self.keep != ("*",):
            raise ConfigError(f"'*' keeps every field: give it alone, got {list(self.keep)}")
        paths = () if self.keep_all else tuple(parse_pointer(p) for p in self.keep)
        object.__setattr__(self, "keep_paths", paths)
        names = self.kept_names
        clash = sorted({n for n in names if names.count(n) > 1} | (set(names) & _RESERVED))
        if clash:
            raise ConfigError(f"kept fields would write {clash} twice or over the output's own id / "
                              "model_sha256: keep each name once")
        object.__setattr__(self, "feature_only_names", self._feature_only_names())

    def _feature_only_names(self) -> frozenset[str]:
        """The top-level fields only the features read (the decoder reads them as doubles): not the
        id's, a kept one (every one outside :attr:`keep_all_skips` with ``*``), nor ``label``."""
        named = {path[0] for path in self.feature_paths if path}
        others = [self.id_path, self.text_path, self.text_pair_path, *self.keep_paths, *self.prompt_paths]
        named -= {path[0] for path in others if path}
        if self.keep_all:
            named &= self.keep_all_skips
        return frozenset(named - {"label"})

    def _set_prompt_paths(self) -> None:
        if self.prompt_fields and (self.value_format is ValueFormat.RAW or self.features):
            raise ConfigError("--prompt-fields are fields of a JSON or Avro record a prompt names beside its "
                              "text: not for raw values or --feature-fields")
        paths = tuple(parse_pointer(p) for p in self.prompt_fields)
        object.__setattr__(self, "prompt_paths", paths)
        names = [path[-1] for path in paths]
        clash = sorted({n for n in names if names.count(n) > 1} | (set(names) & PROMPT_TEXT_NAMES))
        if clash:
            raise ConfigError(f"prompt fields would fill the placeholders {clash} twice (or the text's own "
                              "{text} / {text_pair}): each prompt field's last name must be its own")

    @property
    def prompt_names(self) -> list[str]:
        """The placeholder names of the prompt fields (each pointer's last token), in order."""
        return [path[-1] for path in self.prompt_paths]

    @property
    def id_from_key(self) -> bool:
        """Whether the id is the record's Kafka key (``id="key"``)."""
        return self.id == KEY_ID

    @property
    def kept_names(self) -> list[str]:
        """The output names of the kept fields, in order."""
        return [path[-1] for path in self.keep_paths]

    @property
    def keep_all(self) -> bool:
        """Whether every top-level field is kept (``keep=("*",)``)."""
        return self.keep == ("*",)

    @property
    def keep_all_skips(self) -> frozenset[str]:
        """With :attr:`keep_all`: the top-level names not kept (the text's and the id's own
        field, and the output's ``id`` / ``model_sha256``)."""
        paths = ((self.id_path, *self.feature_paths) if self.features
                 else (self.text_path, self.id_path, self.text_pair_path))
        own = {path[0] for path in paths if path is not None and len(path) == 1}
        return frozenset(own | _RESERVED)

    @property
    def is_default(self) -> bool:
        """Whether this is ``{"id", "text"}`` with nothing kept (the decoder's fast path)."""
        return (self.text, self.id, self.keep, self.value_format, self.features, self.text_pair,
                self.prompt_fields) == ("/text", "/id", (), ValueFormat.JSON, (), None, ())


#: ``{"id", "text"}`` records, nothing kept: the packaged job's default.
DEFAULT_MAPPING = FieldMapping()
