#!/usr/bin/env python3
"""Packs a root directory as a one-layer OCI image layout (what `vm images import` reads).

Usage: oci-pack.py ROOT OUT_DIR REF CONFIG_JSON

ROOT is tarred (GNU tar: numeric owners, xattrs, sorted names, fixed mtime-free ordering)
into one uncompressed layer; CONFIG_JSON is the image config's `config` object (User, Env,
Entrypoint, Cmd, WorkingDir, ...). OUT_DIR gets `oci-layout`, `index.json` (one manifest,
annotated with REF as its ref name) and `blobs/sha256/`. OUT_DIR must not exist.
"""

import hashlib
import json
import os
import subprocess
import sys


def blob(out, data=None, path=None):
    h = hashlib.sha256()
    if path is None:
        h.update(data)
        size = len(data)
    else:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    digest = h.hexdigest()
    dest = os.path.join(out, "blobs", "sha256", digest)
    if path is None:
        with open(dest, "wb") as f:
            f.write(data)
    else:
        os.rename(path, dest)
    return "sha256:" + digest, size


def main(root, out, ref, config):
    os.makedirs(os.path.join(out, "blobs", "sha256"))
    layer = os.path.join(out, "layer.tar")
    subprocess.run(
        ["tar", "--numeric-owner", "--xattrs", "--sort=name", "--format=posix",
         "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
         "-C", root, "-cf", layer, "."],
        check=True,
    )
    layer_digest, layer_size = blob(out, path=layer)
    cfg = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created_by": "images/oci-pack.py"}],
    }
    cfg_digest, cfg_size = blob(out, json.dumps(cfg, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": cfg_digest, "size": cfg_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest, "size": layer_size}],
    }
    man_digest, man_size = blob(out, json.dumps(manifest, sort_keys=True).encode())
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": man_digest, "size": man_size,
                       "annotations": {"org.opencontainers.image.ref.name": ref}}],
    }
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump(index, f, sort_keys=True)
    with open(os.path.join(out, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    print(man_digest)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))
