"""Logging setup: plain text or one JSON object per line (`EPISERVE_LOG_FORMAT=json`).

Every text line is one record: control characters in a message (a request path may carry a decoded `%0a`) are
escaped, so a client cannot forge or split log lines, nor send terminal escape sequences to an operator's screen;
so are Unicode format characters (U+202E would reorder what an operator reads), in JSON lines too.
"""

from __future__ import annotations

import logging
import sys
import time
import unicodedata

import orjson

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}
# uvicorn's copy of its message with ANSI colour codes: noise in a log collector.
_DROPPED = {"color_message"}
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_CONTROL = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029]
_ESCAPES = {
    code: _NAMED_ESCAPES.get(chr(code), f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}") for code in _CONTROL
}


def escape_control(text: str) -> str:
    """`text` with C0/C1 control characters, DEL, Unicode line separators and every Unicode format character
    (category Cf: bidirectional overrides such as U+202E, zero-width characters, the BOM...) written as escapes
    (`\\n`, `\\x1b`, `\\u202e`): what a log line says is what an operator sees."""
    return escape_format(text.translate(_ESCAPES))


def escape_format(text: str) -> str:
    """`text` with every Unicode format character (category Cf) written as an escape (`\\u202e`)."""
    if text.isascii():  # no format character is ASCII: the usual case costs one scan
        return text
    return "".join(_escaped(c) if unicodedata.category(c) == "Cf" else c for c in text)


def _escaped(char: str) -> str:
    code = ord(char)
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message`, the message on one line whatever it contains."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_control(record.message)
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "message", ...extra fields}` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        document = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": escape_format(record.getMessage()),
        }
        document.update(
            {
                k: escape_format(v) if isinstance(v, str) else v
                for k, v in record.__dict__.items()
                if k not in _STANDARD and k not in _DROPPED
            }
        )
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(document, default=str).decode()


def configure_logging(level: str, log_format: str) -> None:
    """Route episerve's and uvicorn's loggers to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").disabled = True  # episerve.access logs every request instead
    # filelock writes four DEBUG lines per segment lock: they would drown the row reads `debug` is set to show.
    logging.getLogger("filelock").setLevel(max(logging.INFO, root.level))
