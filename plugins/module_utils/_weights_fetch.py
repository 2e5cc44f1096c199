# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Copy files of a model from a node that serves its verified copy (the weights role's server), for a while.

Each file is written to a partial copy under the folder's ``.gpulab-partial`` and hashed as it arrives; a partial
copy left by an earlier call (or a cut-off run) is hashed and continued with a byte range, not started again. A
file whose size and sha256 match the expected manifest is moved into place and stamped, so that the proof after
the copy reads nothing again; one that does not match is thrown away and fetched once more from its first byte.
Files go in parallel streams, the largest first. A call copies until its deadline and says what is left: the
caller calls again (and prints progress in between) until nothing is.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import queue
import socket
import threading
import time
from urllib.parse import quote, urlsplit

from ansible_collections.gpulab.vllm.plugins.module_utils import _weights

CHUNK = 1024 * 1024
CONNECT_RETRY = 15.0


class CopyError(Exception):
    """A copy that cannot go on: the source does not answer, refuses, or sends what the manifest does not say."""


# Where a copy in progress lives, and what it holds: _weights reads them too (a proof counts partial copies).
partial_path = _weights.partial_path
partial_bytes = _weights.partial_bytes


def _connect(url, timeout):
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)


class _Hasher:
    """sha256 on a thread of its own beside one stream: hashlib lets go of the GIL while it hashes a chunk, so the
    stream receives and writes the next chunk meanwhile and is bound by the slower of the two, not by their sum."""

    def __init__(self, digest):
        self.digest = digest
        self.chunks = queue.Queue(maxsize=16)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        for chunk in iter(self.chunks.get, None):
            self.digest.update(chunk)

    def update(self, chunk):
        self.chunks.put(chunk)

    def close(self):
        """Wait until every chunk handed over is hashed."""
        self.chunks.put(None)
        self.thread.join()


class Copier:
    def __init__(self, dest, base_url, token, files, streams=4, deadline=None, timeout=30.0):
        self.dest, self.base_url, self.token = dest, base_url.rstrip("/"), token
        self.files = files
        self.streams = max(1, int(streams))
        self.deadline = deadline
        self.timeout = timeout
        self.lock = threading.Lock()
        self.received = 0
        self.resumed = 0
        self.done = {}
        self.retried = []
        self.errors = []

    def _over(self):
        return self.deadline is not None and time.monotonic() >= self.deadline

    def _get(self, rel, start):
        """An open response for the file from byte start, retrying the connection for a few seconds."""
        path = urlsplit(self.base_url).path.rstrip("/") + "/" + quote(rel)
        headers = {"Authorization": "Bearer " + self.token}
        if start:
            headers["Range"] = "bytes=%d-" % start
        tried_until = time.monotonic() + CONNECT_RETRY
        while True:
            conn = _connect(self.base_url, self.timeout)
            try:
                conn.request("GET", path, headers=headers)
                response = conn.getresponse()
                break
            except (ConnectionRefusedError, socket.timeout, OSError) as error:
                conn.close()
                if time.monotonic() >= tried_until:
                    raise CopyError("cannot reach the copy at %s: %s" % (self.base_url, error))
                time.sleep(0.5)
        if response.status == 401:
            conn.close()
            raise CopyError("the copy at %s refused this run's token" % self.base_url)
        if response.status not in ((206,) if start else (200,)):
            body = response.read(200).decode("utf-8", "replace").strip()
            conn.close()
            raise CopyError("the copy at %s answered %d for %s: %s" % (self.base_url, response.status, rel, body))
        return conn, response

    def _one(self, rel):
        entry = self.files[rel]
        part = partial_path(self.dest, rel)
        os.makedirs(os.path.dirname(part), exist_ok=True)
        digest = hashlib.sha256()
        have = 0
        if os.path.exists(part):
            have = os.path.getsize(part)
            if have > entry["size"]:
                os.unlink(part)
                have = 0
            else:
                with open(part, "rb") as stream:  # what arrived before counts: hash it, then continue
                    for chunk in iter(lambda: stream.read(CHUNK), b""):
                        digest.update(chunk)
                with self.lock:
                    self.resumed += have
        if have < entry["size"]:
            conn, response = self._get(rel, have)
            hasher = _Hasher(digest)
            try:
                with open(part, "ab") as out:
                    while have < entry["size"]:
                        if self._over():
                            return False
                        # What has arrived, up to a chunk: a partial copy grows as the bytes come (read() would wait
                        # for a whole chunk before writing any of it).
                        chunk = response.read1(min(CHUNK, entry["size"] - have))
                        if not chunk:
                            raise CopyError("the copy at %s ended %s after %d of %d bytes" % (self.base_url, rel, have, entry["size"]))
                        out.write(chunk)
                        hasher.update(chunk)
                        have += len(chunk)
                        with self.lock:
                            self.received += len(chunk)
            finally:
                hasher.close()
                conn.close()
        found = digest.hexdigest()
        if entry.get("sha256") and found != entry["sha256"]:
            os.unlink(part)
            raise ValueError(found)
        target = os.path.join(self.dest, *rel.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(part, target)
        info = os.stat(target)
        with self.lock:
            self.done[rel] = {"size": info.st_size, "sha256": found, "mtime_ns": info.st_mtime_ns}
        return True

    def _worker(self, work):
        while not self._over():
            try:
                rel = work.get_nowait()
            except queue.Empty:
                return
            try:
                try:
                    self._one(rel)
                except ValueError:  # other bytes than the manifest says: once more from the first byte
                    with self.lock:
                        self.retried.append(rel)
                    self._one(rel)
            except ValueError as error:
                with self.lock:
                    self.errors.append("%s arrived twice with sha256 %s, not the manifest's %s" % (
                        rel, str(error)[:16], self.files[rel]["sha256"][:16]))
            except (CopyError, OSError, http.client.HTTPException) as error:
                with self.lock:
                    self.errors.append(str(error) if isinstance(error, CopyError) else "%s: %s" % (rel, error))
                return

    def run(self):
        """Copy until done, an error, or the deadline; the files finished are in self.done."""
        work = queue.Queue()
        for rel in sorted(self.files, key=lambda r: (-self.files[r]["size"], r)):
            work.put(rel)
        threads = [threading.Thread(target=self._worker, args=(work,), daemon=True)
                   for unused in range(min(self.streams, max(1, len(self.files))))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return self

    @property
    def left(self):
        return sorted(set(self.files) - set(self.done))
