"""A wheel on an index, read without downloading it: its METADATA and its file list through HTTP range
requests (a wheel is a zip, whose central directory sits at its end), under the standard library's
zipfile. The lock reads what torch declares this way (the ROCm SDK it requires, its device-code extras)
from a multi-gigabyte wheel in a few kilobytes, and the probe reads the facts of real wheels.

Hand-written (a seekable file object over ranges) because the only maintained implementations are
pip's internal lazy_wheel and small libraries that bring their own HTTP stack; this one uses the tool's
session (retries, the https-only rule).
"""

from __future__ import annotations

import io
import zipfile
from email.message import Message
from email.parser import Parser

import requests

from vllm_bundle.errors import LockError, NetworkError
from vllm_bundle.util.fetch import UNREACHABLE_HINT
from vllm_bundle.util.policy import PAGE_LIMIT
from vllm_bundle.util.transport import check_url, describe, range_answer_problem

BLOCK = 1 << 16  # bytes per range request (the central directory of a large wheel fits in a few)
#: The most one range request asks for. zipfile reads a member's compressed bytes in one read, which a
#: large library would make one answer larger than a session that bounds bodies (the probe's) takes.
MOST = PAGE_LIMIT


class _RangeFile(io.RawIOBase):
    """The bytes at ``url``, read by range as zipfile seeks through them."""

    def __init__(self, session: requests.Session, url: str, size: int) -> None:
        self.session, self.url, self.size, self.position = session, url, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        if self.position >= self.size or not len(buffer):
            return 0
        end = min(self.position + min(len(buffer), MOST), self.size) - 1
        try:
            answer = self.session.get(self.url, headers={"Range": f"bytes={self.position}-{end}"})
        except requests.RequestException as err:
            raise NetworkError(f"cannot read {self.url}: {describe(err)}", UNREACHABLE_HINT) from None
        if problem := range_answer_problem(answer, self.position, end, self.size):
            raise NetworkError(f"{self.url} answered a range request with {problem}", "the index must serve ranges")
        data = answer.content
        if len(data) != end - self.position + 1:
            raise NetworkError(
                f"{self.url} answered bytes {self.position}-{end} with {len(data)} bytes", "the index must serve ranges"
            )
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)


def open_wheel(session: requests.Session, url: str) -> zipfile.ZipFile:
    """The wheel at ``url`` as a zip file whose members are fetched when read."""
    check_url(url)
    try:
        head = session.head(url, allow_redirects=True)
    except requests.RequestException as err:
        raise NetworkError(f"cannot reach {url}: {describe(err)}", UNREACHABLE_HINT) from None
    length = head.headers.get("Content-Length", "")
    if head.status_code != 200 or not length.isdigit():
        raise LockError(f"cannot read the size of {url} (HTTP {head.status_code})", "check the index")
    reader = io.BufferedReader(_RangeFile(session, head.url, int(length)), buffer_size=BLOCK)
    try:
        return zipfile.ZipFile(reader)
    except zipfile.BadZipFile as err:
        raise LockError(f"{url} is not a wheel: {err}", "check the index") from None


def metadata_of(wheel: zipfile.ZipFile, url: str) -> Message:
    """The ``*.dist-info/METADATA`` of an open wheel."""
    name = next((n for n in wheel.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None)
    if name is None:
        raise LockError(f"{url} has no .dist-info/METADATA", "check the index")
    return Parser().parsestr(wheel.read(name).decode("utf-8", errors="replace"), headersonly=True)


def wheel_metadata(session: requests.Session, url: str) -> Message:
    """The ``*.dist-info/METADATA`` of the wheel at ``url``."""
    with open_wheel(session, url) as wheel:
        return metadata_of(wheel, url)


def wheel_files(session: requests.Session, url: str) -> list[str]:
    with open_wheel(session, url) as wheel:
        return wheel.namelist()
