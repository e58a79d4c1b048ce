"""An MCP tool result as a loopctl ``ToolOutput``: text, with other content described.

A loopctl tool result is text (``ToolResultPart.output``), so each MCP
content block becomes text, in order, joined by blank lines:

- text: as is;
- image / audio: ``[image: image/png, 1234 bytes]``; when the call has a
  temp dir (``ToolContext.temp_dir``) the bytes are written there and the
  description names the file, so another tool (or the app) can use it;
- resource link: ``[resource: name <uri> (mime)]``;
- embedded resource: its text under a ``[resource <uri>]`` line, or for a
  binary one ``[resource <uri>: mime, N bytes]``.

A result with no content but ``structuredContent`` is that object as JSON.
``isError`` makes the output a soft error. Pure functions, no IO except the
optional file write.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import mimetypes
from pathlib import Path
from typing import Optional

import mcp_types as types

from loopctl.tools.base import ToolOutput

_seq = itertools.count(1)


def result_output(result: types.CallToolResult, temp_dir: Optional[Path] = None) -> ToolOutput:
    """The ``ToolOutput`` for a ``tools/call`` result (``isError`` -> soft error)."""
    pieces = [block_text(block, temp_dir) for block in result.content]
    if not pieces and result.structured_content is not None:
        pieces.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return ToolOutput("\n\n".join(pieces), bool(result.is_error))


def block_text(block: object, temp_dir: Optional[Path] = None) -> str:
    """One content block as text (see the module docstring)."""
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, (types.ImageContent, types.AudioContent)):
        kind = "image" if isinstance(block, types.ImageContent) else "audio"
        return _binary(kind, block.mime_type, block.data, temp_dir)
    if isinstance(block, types.ResourceLink):
        mime = f" ({block.mime_type})" if block.mime_type else ""
        return f"[resource: {block.name} <{block.uri}>{mime}]"
    if isinstance(block, types.EmbeddedResource):
        res = block.resource
        if isinstance(res, types.TextResourceContents):
            return f"[resource {res.uri}]\n{res.text}"
        mime = res.mime_type or "application/octet-stream"
        return f"[resource {res.uri}: {mime}, {_size(res.blob)} bytes]"
    kind = getattr(block, "type", type(block).__name__)
    return f"[{kind} content]"


def _size(data: str) -> int:
    # Base64 length without decoding: 3 bytes per 4 characters, minus padding.
    return len(data) * 3 // 4 - data[-2:].count("=") if data else 0


def _binary(kind: str, mime: str, data: str, temp_dir: Optional[Path]) -> str:
    size = _size(data)
    if temp_dir is None:
        return f"[{kind}: {mime}, {size} bytes]"
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return f"[{kind}: {mime}, {size} bytes, not valid base64]"
    ext = mimetypes.guess_extension(mime.split(";")[0].strip()) or ".bin"
    path = Path(temp_dir) / f"mcp-{kind}-{next(_seq)}{ext}"
    try:
        path.write_bytes(raw)
    except OSError:
        return f"[{kind}: {mime}, {len(raw)} bytes]"
    return f"[{kind}: {mime}, {len(raw)} bytes, saved to {path}]"


__all__ = ["block_text", "result_output"]
