"""Read one project's file list from a package index (PEP 691 JSON, or PEP 503 HTML as a fallback).

Only the lock step uses this, to find the vLLM source release; uv resolves the wheels. It is small
enough that a client library (pypi-simple, with pydantic and BeautifulSoup) would weigh more than it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit, urlunsplit

import requests
from packaging.utils import canonicalize_name

from vllm_bundle.errors import InvalidValueError, LockError, NetworkError
from vllm_bundle.util.fetch import UNREACHABLE_HINT
from vllm_bundle.util.fields import Document, Fields
from vllm_bundle.util.transport import check_url, describe
from vllm_bundle.util.validate import SHA256_HEX, sha256_hex

JSON_TYPE = "application/vnd.pypi.simple.v1+json"
#: What a page that is not there answers: 404 on PyPI and rocm.nightlies.amd.com, 403 on repo.amd.com (an
#: S3 origin that may not list: ROCm/rocm-cli#194, #271), 410 where a project was removed.
MISSING = (403, 404, 410)
#: The most files one project's page may list: far above the few thousand the pages of the projects this
#: tool reads list. A page within PAGE_LIMIT's 64 MiB may list hundreds of thousands, each parsed into ~450
#: bytes of Python objects the probe keeps for its whole run: the bytes of a page do not bound the memory
#: its parsing takes, the count of what is parsed does (issue #51: pages of 200,000 links, 41 MiB each,
#: ended in MemoryError).
MOST_FILES = 100_000


def _too_many(page: str, most: int) -> InvalidValueError:
    return InvalidValueError(
        f"the index page {page} lists more than {most:,} files: not an index page this tool reads",
        "check the index URL",
    )


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str
    sha256: str | None
    size: int | None
    upload_time: int | None  # seconds since the epoch


class _Anchors(HTMLParser):
    """The (text, href) of a page's links, refused (:func:`_too_many`) at the first past ``most``: while
    the page is parsed, before the rest of it is."""

    def __init__(self, page: str, most: int) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None
        self._page, self._most = page, most

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            if len(self.links) >= self._most:
                raise _too_many(self._page, self._most)
            self.links.append((data.strip(), self._href))
            self._href = None


def _split_hash(url: str) -> tuple[str, str | None]:
    parts = urlsplit(url)
    algo, _, digest = parts.fragment.partition("=")
    return urlunsplit(parts._replace(fragment="")), digest if algo == "sha256" and digest else None


def _digest(value: object, page: str, filename: str) -> str | None:
    """An index's sha256 for a file, checked (it becomes a cache path), or None when it gives none."""
    if value is None:
        return None
    return sha256_hex(value.lower() if isinstance(value, str) else value, f"the sha256 {page} gives for {filename}")


def _json_files(page: str, response: requests.Response, most: int) -> list[IndexFile]:
    """A PEP 691 page's files, each field checked as it is read (a bad one is one line naming the page
    and the field: ``files[3].url is missing``)."""
    fields = Document(f"the index page {page}", lambda message: InvalidValueError(message, "check the index URL"))
    try:
        doc = fields.fields(response.json())
    except ValueError as err:  # (requests' JSONDecodeError is one)
        raise fields.problem("", f"is not JSON ({err})") from None
    entries = doc.tables("files", required=False)
    if len(entries) > most:
        raise _too_many(page, most)
    return [_json_file(page, entry) for entry in entries]


def _json_file(page: str, entry: Fields) -> IndexFile:
    hashes = entry.table("hashes", required=False)
    digest = hashes.text("sha256", None)
    if digest is not None and not SHA256_HEX.fullmatch(digest.lower()):
        raise hashes.bad("sha256", "a sha256 (64 hex digits)")
    stamp = entry.text("upload-time", None)
    try:
        uploaded = int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()) if stamp else None
    except ValueError:
        raise entry.bad("upload-time", "an ISO 8601 time such as 2025-11-20T12:00:00Z") from None
    return IndexFile(
        filename=entry.text("filename"),
        url=urljoin(page, entry.text("url")),
        sha256=digest.lower() if digest else None,
        size=entry.whole("size", None, unit="bytes"),
        upload_time=uploaded,
    )


def project_files(session: requests.Session, index: str, project: str, most: int = MOST_FILES) -> list[IndexFile]:
    """The files of ``project`` on a simple index, at its normalized name's page (PEP 503: a page's URL
    is the normalized name; TheRock's legacy indexes have ``rocm-sdk-libraries-gfx110x-all/``, never
    ``…-gfx110X-all/``). A page listing more than ``most`` is refused before its files are made."""
    page = index.rstrip("/") + f"/{canonicalize_name(project)}/"
    check_url(page)
    try:
        response = session.get(page, headers={"Accept": f"{JSON_TYPE}, text/html;q=0.1"})
    except requests.RequestException as err:
        raise NetworkError(f"cannot read the index page {page}: {describe(err)}", UNREACHABLE_HINT) from None
    if response.status_code in MISSING:
        status = response.status_code
        raise LockError(
            f"the index {index} has no project {project!r} (HTTP {status})", "check the channel's index URL"
        )
    if response.status_code != 200:
        raise NetworkError(f"the index page {page} answered HTTP {response.status_code}", UNREACHABLE_HINT)
    if response.headers.get("Content-Type", "").startswith(JSON_TYPE):
        return _json_files(page, response, most)
    parser = _Anchors(page, most)
    parser.feed(response.text)
    files = []
    for text, href in parser.links:
        url, sha = _split_hash(urljoin(page, href))
        filename = text or url.rsplit("/", 1)[-1]
        files.append(IndexFile(filename, url, _digest(sha, page, filename), None, None))
    return files


def page_status(session: requests.Session, url: str) -> int:
    """The HTTP status of an index page (an index's root, or a project's page)."""
    check_url(url)
    try:
        return session.get(url, headers={"Accept": "text/html"}).status_code
    except requests.RequestException as err:
        raise NetworkError(f"cannot read the index page {url}: {describe(err)}", UNREACHABLE_HINT) from None


def page_exists(session: requests.Session, url: str) -> bool:
    """Whether an index page is there: 200 yes, 403/404/410 no."""
    status = page_status(session, url)
    if status in MISSING:
        return False
    if status != 200:
        raise NetworkError(f"the index page {url} answered HTTP {status}", UNREACHABLE_HINT)
    return True
