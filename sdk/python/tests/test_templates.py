"""Templates: a build followed through its progress events, an OCI archive
import, and deleting both (operator calls, with the admin key)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from typing import List

import pytest

import airlock


def _tar(files: dict) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            ti.mode = 0o644
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def _oci_archive(files: dict) -> bytes:
    """A minimal OCI image layout (one gzip'ed layer) as a tar."""
    layer_tar = _tar(files)
    layer = gzip.compress(layer_tar, mtime=0)
    blobs = {}

    def blob(data: bytes) -> dict:
        d = hashlib.sha256(data).hexdigest()
        blobs[f"blobs/sha256/{d}"] = data
        return {"digest": f"sha256:{d}", "size": len(data)}

    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "config": {"Env": ["PATH=/usr/bin:/bin"], "Cmd": ["/bin/sh"]},
                         "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer_tar).hexdigest()]}
                         }).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **blob(config)},
                           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **blob(layer)}]
                           }).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", **blob(manifest)}]}).encode()
    return _tar({"oci-layout": b'{"imageLayoutVersion": "1.0.0"}', "index.json": index, **blobs})


def test_build_with_progress_events(client: airlock.Airlock, run_id: str) -> None:
    # run_id makes every step new: the build cache (shared in CI) would skip a known one
    files = _tar({"hello.txt": f"copied {run_id}\n".encode()})
    h = client.templates.builds.upload_file(files)
    assert client.templates.builds.has_file(h)
    events: List[airlock.BuildEvent] = []
    name = f"sdkpy-{run_id}"
    b = client.templates.build({
        "name": name, "tag": "1", "from": "base",
        "steps": [{"kind": "COPY", "args": ["/opt/app/"], "files_hash": h, "chown": "user",
                   "text": "COPY --chown=user . /opt/app/"},
                  {"kind": "RUN", "args": [f"echo built-by-sdk-{run_id}; cat /opt/app/hello.txt > /home/user/built.txt"],
                   "text": f"RUN echo built-by-sdk-{run_id}"}],
    }, on_event=events.append)
    assert b.state == "ready", b
    types = {e.type for e in events}
    assert "step" in types and "done" in types, [(e.type, e.text) for e in events]
    assert any(e.type == "output" and f"built-by-sdk-{run_id}" in e.text for e in events), events
    try:
        with client.sandboxes.create(template=f"{name}:1") as sb:
            assert sb.files.read("/home/user/built.txt") == f"copied {run_id}\n".encode()
    finally:
        client.templates.delete(f"{name}:1")
    with pytest.raises(airlock.NotFound):
        client.templates.get(f"{name}:1")


def test_import_oci_archive(client: airlock.Airlock, run_id: str) -> None:
    name = f"sdkpy-oci-{run_id}"
    archive = _oci_archive({"etc/sdk-marker": b"from an OCI layer\n"})
    t = client.templates.import_archive(f"{name}:v1", io.BytesIO(archive))
    assert t.name == name and t.tag == "v1" and t.digest.startswith("sha256:")
    assert client.templates.get(f"{name}:v1").digest == t.digest
    assert f"{name}:v1" in [x.ref for x in client.templates.list()]
    client.templates.delete(f"{name}:v1")
    with pytest.raises(airlock.InvalidRequest):
        client.templates.import_archive(f"{name}-bad:v1", b"not a tar archive at all")
