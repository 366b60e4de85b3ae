"""HTTP to slurmrestd: the token, one aiohttp session, and how an answer becomes data or an
error. Every answer's ``errors`` are read, and so are ``warnings`` that point into the request
body: slurmrestd answers 200 while ignoring a field it does not know."""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import ijson  # type: ignore[import-untyped]
import yarl

from slurmgate import jsonpool
from slurmgate.slurm.dialects import body_warnings, error_text
from slurmgate.slurm.models import (
    SlurmError,
    SlurmIgnoredField,
    SlurmRefused,
    SlurmUnavailable,
)
from slurmgate.slurm.restmetrics import RestMetrics

log = logging.getLogger("slurmgate.slurm")

# Slurm error numbers meaning "slurmctld could not be reached", not "your request is wrong".
_UNAVAILABLE_ERRNOS = frozenset(
    {1001, 1002, 1003, 1004, 1800, 1801, 1802, 1803, 1804, 5004, 5005, 110, 111, 113}
)
# The first word of every `what` that reads as "Slurm refused to <what>"; other whats name
# a thing ("job 7", "states of 3 jobs") and read as "Slurm refused the request for <what>".
_VERBS = frozenset({"submit", "cancel", "list", "detect", "ping", "drain", "resume"})
# A Python string or bytes literal, as aiohttp quotes the bytes it refused (repr).
_LITERAL = re.compile(r"b?'(?:[^'\\]|\\.)*'" r'|b?"(?:[^"\\]|\\.)*"', re.DOTALL)
_STATUS_LINE = re.compile(r"HTTP/\d(?:\.\d)? (\d{3}) ")


def _refused(what: str) -> str:
    verb = what.split(" ", 1)[0]
    return f"Slurm refused to {what}" if verb in _VERBS else f"Slurm refused the request for {what}"


def _read_errors(items: Any) -> tuple[list[str], list[int]]:
    """Slurm's words and numbers from an answer's errors[] (every dialect's entry shape)."""
    errors: list[str] = []
    errnos: list[int] = []
    for item in items if isinstance(items, list) else []:
        t, n = error_text(item)
        errors.append(t)
        if n is not None:
            errnos.append(n)
    return errors, errnos


def _failure(what: str, status: int | None, errors: list[str], errnos: list[int], *,
             said: bool, unreachable: bool = False) -> SlurmError:
    """The error for an answer that is no success. ``said``: ``errors`` are Slurm's own (from
    errors[]), not a snippet of a body we could not read; ``unreachable``: the answer itself
    shows slurmrestd could not serve us (a 5xx that is not even JSON)."""
    cls: type[SlurmError]
    if (unreachable or status in (502, 503, 504)
            or any(n in _UNAVAILABLE_ERRNOS for n in errnos)
            or any("Unable to contact slurm controller" in e for e in errors)):
        cls, head = SlurmUnavailable, f"{what} failed"
    elif said:
        cls, head = SlurmRefused, _refused(what)
    else:
        cls, head = SlurmError, f"{what} failed"
    err = cls(head, status, errors)
    err.errnos = errnos
    return err


def _unquote(quoted: str) -> str:
    """The text aiohttp quoted in its error (a bytes or str repr), else ``quoted`` as is."""
    best = ""
    for m in _LITERAL.finditer(quoted):
        try:
            v = ast.literal_eval(m.group(0))
        except (ValueError, SyntaxError):
            continue
        text = v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)
        if len(text) > len(best):
            best = text
    return best or quoted


def _quoted_errors(text: str) -> list[Any]:
    """The entries of the first errors[] in ``text``: whole ones only, the quote may be cut."""
    m = re.search(r'"errors"\s*:\s*\[', text)
    if m is None:
        return []
    dec = json.JSONDecoder()
    items: list[Any] = []
    i = m.end()
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return items
        try:
            item, i = dec.raw_decode(text, i)
        except ValueError:
            return items
        items.append(item)


def _garbled(what: str, quoted: str) -> SlurmError:
    """slurmrestd 26.05 answers some errors with the JSON body before the status line;
    aiohttp refuses the message but quotes the bytes, and Slurm's errors[] are in the quote.
    What Slurm said there is its answer; only a quote without it is a malformed answer."""
    text = _unquote(quoted)
    errors, errnos = _read_errors(_quoted_errors(text))
    codes = _STATUS_LINE.findall(text)
    status = int(codes[-1]) if codes else None
    if not errors:  # a cut quote: Slurm's words and numbers by pattern, escaped or not
        errors = re.findall(r'"(?:description|error)\\*"\s*:\s*\\*"([^"\\]+)', quoted)
        errnos = [int(n) for n in re.findall(r'error_number\\*"?\s*:\s*(\d+)', quoted)]
    if not errors:
        err = SlurmError(f"{what}: slurmrestd sent a malformed HTTP answer", status,
                         [quoted[:300]])
        err.errnos = errnos
        return err
    return _failure(what, status, errors, errnos, said=True)


class Token:
    """Token file cache: re-read when the file changes (a rotated Secret), never logged."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._key: tuple[int, int, int] | None = None
        self._value = ""

    def get(self) -> str:
        try:
            st = os.stat(self.path)
        except OSError as e:
            raise SlurmError(f"cannot read Slurm token file {self.path}: {e}") from None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self._key:
            try:
                raw = self.path.read_text()
            except OSError as e:
                raise SlurmError(f"cannot read Slurm token file {self.path}: {e}") from None
            tok = raw.strip()
            if tok.startswith("SLURM_JWT="):  # raw `scontrol token` output
                tok = tok[len("SLURM_JWT=") :].strip()
            if not tok:
                raise SlurmError(f"Slurm token file {self.path} is empty")
            self._value = tok
            self._key = key
        return self._value

    def invalidate(self) -> None:
        self._key = None


class Transport:
    def __init__(self, base_url: str, token_file: Path | str, user: str, timeout: float,
                 connections: int, json_offload_bytes: int | None = None,
                 metrics: RestMetrics | None = None) -> None:
        self.metrics = metrics
        self.base_url = base_url.rstrip("/")
        self.json_offload_bytes = json_offload_bytes
        self.user = user
        self.token = Token(Path(token_file))
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._connections),
                timeout=self.timeout,
            )
        return self._session

    def _headers(self, user: str | None = None) -> dict[str, str]:
        # The token is the SlurmUser's; slurmrestd lets it act for the user named here
        return {
            "X-SLURM-USER-NAME": user or self.user,
            "X-SLURM-USER-TOKEN": self.token.get(),
            "Accept": "application/json",
        }

    @contextlib.asynccontextmanager
    async def _exchange(self, method: str, path: str, what: str, seconds: float | None,
                        **kw: Any) -> AsyncIterator[tuple[aiohttp.ClientResponse, _Count]]:
        """One HTTP exchange: slurmrestd's failures to answer as SlurmErrors, and the metrics
        (the caller counts the bytes it read in the yielded _Count)."""
        limit = aiohttp.ClientTimeout(total=seconds) if seconds else self.timeout
        t0 = time.perf_counter()
        count = _Count()
        query = kw.pop("query", None)
        # a query escaped by the caller stays as it is: slurmdbd's refuses ':' and '/' that
        # yarl leaves unescaped (the metrics still name the path alone)
        url: str | yarl.URL = (yarl.URL(f"{self.base_url}{path}?{query}", encoded=True)
                               if query else f"{self.base_url}{path}")
        try:
            async with self.session().request(method, url, timeout=limit, **kw) as resp:
                count.status = resp.status
                yield resp, count
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
            raise SlurmUnavailable(
                f"{what}: cannot reach slurmrestd at {self.base_url}: {e}"
            ) from None
        except aiohttp.ClientResponseError as e:
            # slurmrestd 26.05 answers some errors with the body BEFORE the status line:
            # aiohttp refuses the message but quotes it, Slurm's own words included
            raise _garbled(what, str(e.message)) from None
        except TimeoutError:
            raise SlurmUnavailable(
                f"{what}: slurmrestd at {self.base_url} did not answer within "
                f"{limit.total}s"
            ) from None
        finally:
            if self.metrics is not None:
                self.metrics.observe(method, path, count.status, count.bytes,
                                     time.perf_counter() - t0)

    async def request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        params: Mapping[str, str] | Sequence[tuple[str, str]] | None = None,
        query: str | None = None,
        body: Any = None,
        allow_304: bool = False,
        keep_comment_prefix: str | None = None,
        user: str | None = None,
        seconds: float | None = None,
    ) -> tuple[int, dict[str, Any] | None]:
        """One request; returns (status, parsed JSON or None for 304). Raises SlurmError.

        ``keep_comment_prefix``: of a job list keep only the jobs whose comment starts with
        it (dropped while parsing, which big bodies do in a worker process).
        A 2xx answer whose warnings point into ``body`` raises SlurmIgnoredField, with the
        parsed answer in ``.answer`` (a submit may have created a job all the same).
        ``user``: act as this Slurm user for this request only (default: ``self.user``).
        ``seconds``: how long this request may take (default: the client's timeout).
        ``query``: a query string escaped already, sent as it is."""
        async with self._exchange(method, path, what, seconds, params=params, query=query,
                                  json=body,
                                  headers=self._headers(user)) as (resp, count):
            status = resp.status
            if status == 304 and allow_304:
                return status, None
            raw = await resp.read()
            count.bytes = len(raw)
        return status, await self._answer(what, status, raw, body, keep_comment_prefix)

    async def _answer(self, what: str, status: int, raw: bytes, body: Any,
                      keep_comment_prefix: str | None = None) -> dict[str, Any] | None:
        data: dict[str, Any] | None
        try:
            parsed = await jsonpool.load_async(raw, keep_comment_prefix,
                                               self.json_offload_bytes)
            data = parsed if isinstance(parsed, dict) else None
        except ValueError:
            data = None
        if status in (401, 403):
            self.token.invalidate()
        return _checked(what, status, raw, data, body)

    async def items(self, path: str, *, what: str, prefix: str, keep: Callable[[Any], bool],
                    seconds: float | None = None) -> list[Any]:
        """GET `path` and parse the answer while it arrives, keeping only the items at
        `prefix` (ijson's path, e.g. "jobs.item") that `keep` accepts. A site's whole job list
        is hundreds of MB of JSON at 50,000 jobs: neither its bytes nor its objects are ever
        held whole (one item at a time, parsed in C). An answer that is no success is read and
        raised as `request` does."""
        async with self._exchange("GET", path, what, seconds,
                                  headers=self._headers()) as (resp, count):
            if not 200 <= resp.status < 300:
                raw = await resp.read()
                count.bytes = len(raw)
                await self._answer(what, resp.status, raw, None)
                raise SlurmError(f"{what} failed", resp.status)  # _answer raised already
            try:
                kept = [x async for x in ijson.items_async(resp.content, prefix, use_float=True)
                        if keep(x)]
            except ijson.JSONError as e:
                raise SlurmError(f"{what}: slurmrestd sent malformed JSON: {e}",
                                 resp.status) from None
            finally:
                count.bytes = resp.content.total_bytes
        return kept


@dataclass
class _Count:
    status: int | None = None
    bytes: int = 0


def _checked(what: str, status: int, raw: bytes, data: dict[str, Any] | None,
             sent: Any) -> dict[str, Any] | None:
    """``data`` of an answer that is a success, else the error it is."""
    snippet = raw[:4096].decode("utf-8", errors="replace")  # for error messages only
    errors, errnos = _read_errors((data or {}).get("errors") or [])
    if 200 <= status < 300 and data is None:
        raise SlurmError(f"{what}: slurmrestd sent no JSON object", status, [snippet[:200]])
    if 200 <= status < 300 and not errors:
        ignored = body_warnings(data or {}) if sent is not None else []
        if ignored:
            raise SlurmIgnoredField(
                f"{what}: slurmrestd ignored or misread fields we sent", status, ignored,
                data or {})
        return data
    said = bool(errors)
    if not said and snippet.strip():
        errors = [snippet.strip()[:500]]
    err = _failure(what, status, errors, errnos, said=said,
                   unreachable=status >= 500 and data is None)
    err.answer = data
    raise err
