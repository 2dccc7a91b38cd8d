#!/usr/bin/env python3
"""Package pd_router.wasm as an OCI image that Istio and Envoy Gateway pull.

    oci-image.py build WASM OUT_DIR TAG    write an OCI image layout; the last line
                                           printed is the manifest digest
    oci-image.py digest OUT_DIR [--tag T]  print the manifest digest
    oci-image.py extract OUT_DIR DEST [--tag T]
                                           take plugin.wasm out of a layout the way
                                           Istio's image fetcher does
    oci-image.py binary BINARY OUT_DIR TAG  a linux/amd64 container image layout
                                           holding BINARY (statically linked) as its
                                           entrypoint, e.g. mock-engine for a dry run

Format: the "compat" variant of the Wasm image spec (solo-io/wasm spec-compat.md),
the one both fetchers try first for an OCI manifest: an OCI image manifest whose
LAST layer is `application/vnd.oci.image.layer.v1.tar+gzip` and holds a file
named `plugin.wasm`. The config blob is a plain image config
(architecture "wasm", os "wasip1"); neither fetcher reads it. What users pin
(WasmPlugin `spec.sha256`, EnvoyExtensionPolicy `wasm[].code.image.sha256`, or
`@sha256:` in the URL) is the MANIFEST digest this script prints, not the sha256
of the .wasm file.

Reproducibility: nothing in the layout depends on the time, the user, the host
name, the file's mode on disk or the directory it is built in. The tar entry has
mtime 0, uid/gid 0, empty uname/gname, mode 0644; the gzip header has mtime 0,
no file name and a fixed OS byte; JSON is written with sorted keys and compact
separators; the config has no `created` field. The gzip *deflate stream* is
produced by zlib, whose output may differ between zlib versions (and builds of
it), so the promise is: the same commit built with the same toolchain image
(same Python, same zlib) gives byte-identical blobs and the same manifest
digest. A different zlib may give another digest for the same wasm; the image
is still valid.

Standard library only (Python 3.11). Errors are one line on stderr, exit code 1.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import sys
import tarfile
from pathlib import Path

MANIFEST_MT = "application/vnd.oci.image.manifest.v1+json"
INDEX_MT = "application/vnd.oci.image.index.v1+json"
CONFIG_MT = "application/vnd.oci.image.config.v1+json"
LAYER_MT = "application/vnd.oci.image.layer.v1.tar+gzip"
# Istio's fetcher also takes a Docker schema 2 manifest whose last layer is a
# Docker rootfs tar.gzip (its `extractDockerImage`); same extraction path.
DOCKER_MANIFEST_MT = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LAYER_MT = "application/vnd.docker.image.rootfs.diff.tar.gzip"
WASM_ARTIFACT_LAYER_MT = "application/vnd.module.wasm.content.layer.v1+wasm"
REF_NAME = "org.opencontainers.image.ref.name"
PLUGIN_FILE = "plugin.wasm"
WASM_MAGIC = b"\x00asm"
# Docker/OCI distribution tag grammar (what `docker://repo:TAG` accepts).
TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")


class Fail(Exception):
    """A user-facing error: printed as one line, exit code 1."""


def canonical_json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def is_wasm(data: bytes) -> bool:
    # Istio's isValidWasmBinary (pkg/wasm/cache.go): 8-byte header, magic first.
    return len(data) >= 8 and data[:4] == WASM_MAGIC


# ---------------------------------------------------------------- build


def layer_tar(wasm: bytes) -> bytes:
    buf = io.BytesIO()
    info = tarfile.TarInfo(PLUGIN_FILE)
    info.size = len(wasm)
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    # PAX format; with an ASCII name and integer fields no extended header is
    # needed, so this is a plain ustar entry. The archive ends with the usual
    # zero blocks, padded to tarfile's fixed record size.
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(wasm))
    return buf.getvalue()


def gzip_bytes(data: bytes) -> bytes:
    # GzipFile writes the header itself: no FNAME (filename=""), MTIME 0,
    # XFL 2 (level 9), OS 255. (gzip.compress(mtime=0) would let zlib write the
    # header, with the OS byte of the build host.)
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        gz.write(data)
    return buf.getvalue()


def descriptor(media_type: str, blob: bytes, annotations: dict | None = None) -> dict:
    d = {"mediaType": media_type, "digest": sha256(blob), "size": len(blob)}
    if annotations:
        d["annotations"] = annotations
    return d


def prepare_out_dir(out: Path) -> None:
    """OUT_DIR must be absent, empty, or an OCI layout (which is replaced)."""
    if out.exists() and not out.is_dir():
        raise Fail(f"{out} exists and is not a directory")
    if not out.exists():
        out.mkdir(parents=True)
        return
    entries = set(os.listdir(out))
    if not entries:
        return
    if "oci-layout" not in entries or not entries <= {"oci-layout", "index.json", "blobs"}:
        raise Fail(f"{out} is neither empty nor an OCI image layout; refusing to overwrite it")
    blobs = out / "blobs"
    if blobs.exists():
        for algo in blobs.iterdir():
            if not algo.is_dir() or any(not f.is_file() for f in algo.iterdir()):
                raise Fail(f"{out}: unexpected entry under blobs/ ({algo.name}); refusing to overwrite it")
        for algo in blobs.iterdir():
            for f in algo.iterdir():
                f.unlink()
            algo.rmdir()
        blobs.rmdir()
    for name in ("index.json", "oci-layout"):
        if (out / name).exists():
            (out / name).unlink()


def write_blob(out: Path, blob: bytes) -> str:
    digest = sha256(blob)
    path = out / "blobs" / "sha256" / digest.removeprefix("sha256:")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(blob)
    return digest


def build(wasm_path: Path, out: Path, tag: str) -> None:
    if not TAG_RE.fullmatch(tag):
        raise Fail(f"bad tag {tag!r}: must match [A-Za-z0-9_][A-Za-z0-9._-]{{0,127}}")
    try:
        wasm = wasm_path.read_bytes()
    except OSError as e:
        raise Fail(f"cannot read {wasm_path}: {e.strerror}") from None
    if not is_wasm(wasm):
        raise Fail(f"{wasm_path} is not a WebAssembly module (no \\0asm magic)")

    tar = layer_tar(wasm)
    layer = gzip_bytes(tar)
    config = canonical_json(
        {
            "architecture": "wasm",
            "os": "wasip1",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [sha256(tar)]},
        }
    )
    manifest = canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MT,
            "config": descriptor(CONFIG_MT, config),
            "layers": [descriptor(LAYER_MT, layer)],
        }
    )
    index = canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": INDEX_MT,
            "manifests": [descriptor(MANIFEST_MT, manifest, {REF_NAME: tag})],
        }
    )

    prepare_out_dir(out)
    for blob in (layer, config, manifest):
        write_blob(out, blob)
    (out / "oci-layout").write_bytes(canonical_json({"imageLayoutVersion": "1.0.0"}))
    (out / "index.json").write_bytes(index)

    print(f"{out}: tag {tag}, {PLUGIN_FILE} {len(wasm)} bytes {sha256(wasm)}, layer {sha256(layer)}")
    print("manifest digest (pin this in WasmPlugin sha256 / EnvoyExtensionPolicy image.sha256):")
    print(sha256(manifest))


def binary_image(binary_path: Path, out: Path, tag: str) -> None:
    """A container image of one statically linked binary at /<name>, run as
    65532 (no base image: nothing else is in it)."""
    if not TAG_RE.fullmatch(tag):
        raise Fail(f"bad tag {tag!r}: must match [A-Za-z0-9_][A-Za-z0-9._-]{{0,127}}")
    try:
        data = binary_path.read_bytes()
    except OSError as e:
        raise Fail(f"cannot read {binary_path}: {e.strerror}") from None
    if not data.startswith(b"\x7fELF"):
        raise Fail(f"{binary_path} is not an ELF binary")
    name = binary_path.name
    buf = io.BytesIO()
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o755
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(data))
    tar_bytes = buf.getvalue()
    layer = gzip_bytes(tar_bytes)
    config = canonical_json(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": [f"/{name}"], "User": "65532:65532"},
            "rootfs": {"type": "layers", "diff_ids": [sha256(tar_bytes)]},
        }
    )
    manifest = canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MT,
            "config": descriptor(CONFIG_MT, config),
            "layers": [descriptor(LAYER_MT, layer)],
        }
    )
    index = canonical_json(
        {"schemaVersion": 2, "mediaType": INDEX_MT, "manifests": [descriptor(MANIFEST_MT, manifest, {REF_NAME: tag})]}
    )
    prepare_out_dir(out)
    for blob in (layer, config, manifest):
        write_blob(out, blob)
    (out / "oci-layout").write_bytes(canonical_json({"imageLayoutVersion": "1.0.0"}))
    (out / "index.json").write_bytes(index)
    print(f"{out}: tag {tag}, /{name} {len(data)} bytes, layer {sha256(layer)}")
    print(sha256(manifest))


# ---------------------------------------------------------------- read


def load_json(data: bytes, what: str) -> dict:
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise Fail(f"{what} is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise Fail(f"{what} is not a JSON object")
    return obj


def read_blob(layout: Path, desc: object, what: str) -> bytes:
    """A blob named by a descriptor, checked against its digest and size
    (go-containerregistry verifies both on every read)."""
    if not isinstance(desc, dict):
        raise Fail(f"{what}: descriptor is not an object")
    digest = desc.get("digest")
    if not isinstance(digest, str) or not DIGEST_RE.fullmatch(digest):
        raise Fail(f"{what}: unsupported or malformed digest {digest!r}")
    path = layout / "blobs" / "sha256" / digest.removeprefix("sha256:")
    try:
        blob = path.read_bytes()
    except OSError as e:
        raise Fail(f"{what}: cannot read blob {path}: {e.strerror}") from None
    if sha256(blob) != digest:
        raise Fail(f"{what}: blob {digest} has digest {sha256(blob)}")
    if desc.get("size") != len(blob):
        raise Fail(f"{what}: blob {digest} is {len(blob)} bytes, descriptor says {desc.get('size')!r}")
    return blob


def manifest_descriptor(layout: Path, tag: str | None) -> dict:
    """The index entry for TAG, or the only entry when no tag is given."""
    if not (layout / "oci-layout").is_file():
        raise Fail(f"{layout} is not an OCI image layout (no oci-layout file)")
    try:
        index = load_json((layout / "index.json").read_bytes(), f"{layout}/index.json")
    except OSError as e:
        raise Fail(f"cannot read {layout}/index.json: {e.strerror}") from None
    entries = index.get("manifests")
    if not isinstance(entries, list) or not entries or not all(isinstance(m, dict) for m in entries):
        raise Fail(f"{layout}/index.json lists no manifests")

    def ref(m: dict) -> object:
        ann = m.get("annotations")
        return ann.get(REF_NAME) if isinstance(ann, dict) else None

    if tag is not None:
        found = [m for m in entries if ref(m) == tag]
        if not found:
            tags = ", ".join(str(ref(m)) for m in entries)
            raise Fail(f"{layout}/index.json has no manifest tagged {tag!r} (tags: {tags})")
        desc = found[0]
    elif len(entries) == 1:
        desc = entries[0]
    else:
        tags = ", ".join(str(ref(m)) for m in entries)
        raise Fail(f"{layout}/index.json lists {len(entries)} manifests ({tags}); choose one with --tag")
    if desc.get("mediaType") == INDEX_MT:
        raise Fail(f"{layout}: the entry is an image index, not an image manifest (multi-platform images are not supported)")
    return desc


def go_base(name: str) -> str:
    # Go's filepath.Base: trailing slashes dropped, "" -> ".".
    stripped = name.rstrip("/")
    if not stripped:
        return "/" if name else "."
    return stripped.rsplit("/", 1)[-1]


def extract_plugin(layer: bytes) -> bytes:
    """Istio's extractWasmPluginBinary: gunzip, walk the tar, the FIRST entry
    whose basename is plugin.wasm (any directory) wins."""
    try:
        tar_bytes = gzip.decompress(layer)
    except (OSError, EOFError, ValueError) as e:
        raise Fail(f"failed to parse layer as tar.gz: {e}") from None
    try:
        with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tar:
            for member in tar:
                if go_base(member.name) == PLUGIN_FILE:
                    f = tar.extractfile(member)
                    data = f.read() if f is not None else b""
                    if len(data) != member.size:
                        raise Fail(f"failed to read {PLUGIN_FILE}: short read")
                    return data
    except tarfile.TarError as e:
        raise Fail(f"layer is not a valid tar archive: {e}") from None
    raise Fail(f"{PLUGIN_FILE} not found in the archive")


def extract(layout: Path, dest: Path, tag: str | None) -> None:
    desc = manifest_descriptor(layout, tag)
    manifest = load_json(read_blob(layout, desc, "manifest"), "manifest")
    mt = manifest.get("mediaType")
    # Istio: a Docker schema 2 manifest wants a Docker layer, anything else is
    # tried as the OCI compat variant. (Its third path, the "oci" variant with
    # exactly two layers incl. a raw-wasm layer, is not what `build` writes.)
    want = DOCKER_LAYER_MT if mt == DOCKER_MANIFEST_MT else LAYER_MT
    layers = manifest.get("layers")
    if not isinstance(layers, list) or not layers:
        raise Fail("manifest: number of layers must be greater than zero")
    last = layers[-1]
    got = last.get("mediaType") if isinstance(last, dict) else None
    if got != want:
        hint = " (an \"oci\"-variant artifact; this tool reads the compat variant only)" if got == WASM_ARTIFACT_LAYER_MT else ""
        raise Fail(f"manifest: last layer has invalid media type {got} (expect {want}){hint}")
    wasm = extract_plugin(read_blob(layout, last, "last layer"))
    if not is_wasm(wasm):
        raise Fail(f"{PLUGIN_FILE} in the image is not a WebAssembly module (no \\0asm magic)")
    try:
        dest.write_bytes(wasm)
    except OSError as e:
        raise Fail(f"cannot write {dest}: {e.strerror}") from None
    print(f"{dest}: {len(wasm)} bytes {sha256(wasm)} from manifest {desc.get('digest')}")


def digest(layout: Path, tag: str | None) -> None:
    desc = manifest_descriptor(layout, tag)
    read_blob(layout, desc, "manifest")  # the digest must name a real, intact blob
    print(desc["digest"])


# ---------------------------------------------------------------- main


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 1 (not argparse's 2)
        sys.stderr.write(f"oci-image.py: {message} (see --help)\n")
        sys.exit(1)


def main(argv: list[str]) -> int:
    p = Parser(prog="oci-image.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    b = sub.add_parser("build", help="write an OCI image layout holding WASM as plugin.wasm")
    b.add_argument("wasm", type=Path)
    b.add_argument("out_dir", type=Path)
    b.add_argument("tag")
    d = sub.add_parser("digest", help="print the manifest digest of a layout")
    d.add_argument("out_dir", type=Path)
    d.add_argument("--tag")
    e = sub.add_parser("extract", help="write the layout's plugin.wasm to DEST_FILE, as Istio reads it")
    e.add_argument("out_dir", type=Path)
    e.add_argument("dest_file", type=Path)
    e.add_argument("--tag")
    c = sub.add_parser("binary", help="write a linux/amd64 container image layout running BINARY")
    c.add_argument("binary", type=Path)
    c.add_argument("out_dir", type=Path)
    c.add_argument("tag")
    args = p.parse_args(argv)
    try:
        if args.cmd == "build":
            build(args.wasm, args.out_dir, args.tag)
        elif args.cmd == "digest":
            digest(args.out_dir, args.tag)
        elif args.cmd == "binary":
            binary_image(args.binary, args.out_dir, args.tag)
        else:
            extract(args.out_dir, args.dest_file, args.tag)
    except Fail as err:
        sys.stderr.write(f"oci-image.py {args.cmd}: {err}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
