"""Receive a multipart upload straight to a temporary file, with a size cap.

The body is parsed as it arrives (never held in memory, never spooled whole
before the cap is checked). The file part goes to a temp file with a random
name; its suffix is chosen from its first bytes (gzip, zstd or plain), never
from the client's file name. The caller removes the file (see `Upload.cleanup`).
"""
from __future__ import annotations

import asyncio
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from python_multipart.multipart import MultipartParser, parse_options_header

from alloctrace.traces.errors import UserError

FIELD_LIMIT = 4096  # bytes of a non-file field (the trace name)
MAX_TAG_FIELDS = 64
BODY_SLACK = 64 * 1024  # multipart framing and the small fields, on top of the file cap
# a client that sends nothing for this long is cut off (slowloris bodies)
BODY_IDLE_TIMEOUT_S = float(os.environ.get("ALLOCTRACE_BODY_TIMEOUT_S") or 30.0)
GZIP_MAGIC, ZSTD_MAGIC = b"\x1f\x8b", b"\x28\xb5\x2f\xfd"


class UploadError(UserError):
    """A malformed or refused upload; `status` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class Upload:
    path: Path | None  # the received file, or None when the form had no `file`
    filename: str | None  # as the client sent it: data only, never used as a path
    fields: dict
    n_bytes: int = 0

    def cleanup(self):
        if self.path is not None:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass


def suffix_for(head: bytes) -> str:
    if head.startswith(GZIP_MAGIC):
        return ".log.gz"
    if head.startswith(ZSTD_MAGIC):
        return ".log.zst"
    return ".log"


def _disposition(headers: dict) -> tuple[str | None, str | None]:
    value = headers.get(b"content-disposition", b"")
    kind, params = parse_options_header(value)
    if kind != b"form-data":
        return None, None

    def text(b):
        return None if b is None else b.decode("utf-8", "replace")

    return text(params.get(b"name")), text(params.get(b"filename"))


class _FormReader:
    """MultipartParser callbacks: one file part to disk, small text fields to memory."""

    def __init__(self, tmp_dir: Path, max_bytes: int):
        self.tmp_dir, self.max_bytes = tmp_dir, max_bytes
        self.fields: dict = {}
        self.file_path: Path | None = None
        self.filename: str | None = None
        self.n_bytes = 0
        self._fh = None
        self._head = b""
        self._headers: dict = {}
        self._hname = b""
        self._hvalue = b""
        self._part: str | None = None
        self._is_file = False
        self._buf: list = []
        self._buf_len = 0
        self.ended = False

    # header callbacks
    def on_part_begin(self):
        self._headers, self._part, self._is_file, self._buf, self._buf_len = {}, None, False, [], 0

    def on_header_field(self, data, start, end):
        self._hname += data[start:end]

    def on_header_value(self, data, start, end):
        self._hvalue += data[start:end]

    def on_header_end(self):
        self._headers[self._hname.lower()] = self._hvalue
        self._hname, self._hvalue = b"", b""

    def on_headers_finished(self):
        name, filename = _disposition(self._headers)
        self._part = name
        if name == "file":
            if self.file_path is not None:
                raise UploadError("only one `file` per upload")
            self._is_file = True
            self.filename = filename
            fd, path = tempfile.mkstemp(prefix="upload-", suffix=".part", dir=self.tmp_dir)
            self._fh = os.fdopen(fd, "wb")
            self.file_path = Path(path)

    def on_part_data(self, data, start, end):
        chunk = data[start:end]
        if self._is_file:
            self.n_bytes += len(chunk)
            if self.n_bytes > self.max_bytes:
                raise UploadError(f"upload is larger than the limit of {self.max_bytes} bytes", 413)
            if len(self._head) < 4:
                self._head += chunk[:4]
            self._fh.write(chunk)
        elif self._part is not None:
            self._buf_len += len(chunk)
            if self._buf_len > FIELD_LIMIT:
                raise UploadError(f"form field {self._part!r} is longer than {FIELD_LIMIT} bytes")
            self._buf.append(chunk)

    def on_part_end(self):
        if self._is_file:
            self._fh.close()
            self._fh = None
        elif self._part == "tag":  # repeatable: key=value tags for the stored traces
            tags = self.fields.setdefault("tag", [])
            if len(tags) >= MAX_TAG_FIELDS:
                raise UploadError(f"at most {MAX_TAG_FIELDS} `tag` fields")
            tags.append(b"".join(self._buf).decode("utf-8", "replace"))
        elif self._part is not None:
            self.fields[self._part] = b"".join(self._buf).decode("utf-8", "replace")

    def on_end(self):
        self.ended = True

    def close(self):
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def discard(self):
        self.close()
        if self.file_path is not None:
            self.file_path.unlink(missing_ok=True)
            self.file_path = None

    def callbacks(self) -> dict:
        return {k: getattr(self, k) for k in ("on_part_begin", "on_header_field", "on_header_value",
                                               "on_header_end", "on_headers_finished", "on_part_data",
                                               "on_part_end", "on_end")}


async def receive_upload(request, tmp_dir: Path, max_bytes: int) -> Upload:
    """Stream a multipart/form-data request body into a temp file under `tmp_dir`.

    Raises UploadError (400/411/413/415) and leaves no file behind on any failure,
    including a client that disconnects half way.
    """
    kind, params = parse_options_header(request.headers.get("content-type", ""))
    if kind != b"multipart/form-data":
        raise UploadError("expected a multipart/form-data body with a `file` field", 415)
    boundary = params.get(b"boundary")
    if not boundary:
        raise UploadError("multipart body without a boundary")
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > max_bytes + BODY_SLACK:
                raise UploadError(f"upload is larger than the limit of {max_bytes} bytes", 413)
        except ValueError:
            raise UploadError("bad Content-Length") from None
    reader = _FormReader(tmp_dir, max_bytes)
    parser = MultipartParser(boundary, reader.callbacks(), max_size=max_bytes + BODY_SLACK)
    received = 0
    chunks = request.stream().__aiter__()
    try:
        while True:
            try:
                chunk = await asyncio.wait_for(chunks.__anext__(), BODY_IDLE_TIMEOUT_S)
            except StopAsyncIteration:
                break
            except asyncio.TimeoutError:
                raise UploadError(f"the client sent nothing for {BODY_IDLE_TIMEOUT_S:g} s", 408) from None
            received += len(chunk)
            if received > max_bytes + BODY_SLACK:
                raise UploadError(f"upload is larger than the limit of {max_bytes} bytes", 413)
            parser.write(chunk)
        parser.finalize()
        reader.close()
        if not reader.ended:
            raise UploadError("incomplete multipart body (no closing boundary)")
    except UploadError:
        reader.discard()
        raise
    except ValueError as e:  # python-multipart's parse errors (and its max_size)
        reader.discard()
        raise UploadError(f"malformed multipart body: {e}") from None
    except BaseException:  # a disconnect or a cancelled request: nothing may stay behind
        reader.discard()
        raise
    if reader.file_path is None:
        return Upload(None, None, reader.fields)
    final = reader.file_path.with_name(reader.file_path.name[:-len(".part")] + suffix_for(reader._head))
    os.replace(reader.file_path, final)
    return Upload(final, reader.filename, reader.fields, reader.n_bytes)
