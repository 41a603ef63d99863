#!/usr/bin/env bash
# Lay out the root file system of installer/Dockerfile's image in a directory: exactly one
# file, /openshell-sandbox, mode 0555. For tests, since nothing here can build images.
#
# Usage: installer/image-rootfs.sh OUT_DIR BINARY
#   OUT_DIR  must not exist, or be an empty directory; it is filled atomically (built beside
#            it, then renamed), so a failure leaves nothing behind.
#   BINARY   the openshell-sandbox build; it must be a statically linked ELF executable.
# Running it from the rootfs needs /proc (the binary reads /proc/self/exe), as a container
# runtime would provide: e.g. mount -t proc proc OUT_DIR/proc after mkdir, inside a namespace.
set -euo pipefail

die() { echo "image-rootfs: $*" >&2; exit 1; }

[[ $# -eq 2 ]] || die "usage: $0 OUT_DIR BINARY"
out=$1
bin=$2

[[ -e "$bin" ]] || die "binary $bin does not exist"
[[ -f "$bin" ]] || die "binary $bin is not a regular file"
[[ -r "$bin" ]] || die "binary $bin is not readable"

# A FROM-scratch image has no dynamic loader: refuse anything that asks for one.
python3 - "$bin" <<'PY' || exit 1
import struct, sys
path = sys.argv[1]
def die(msg):
    print(f"image-rootfs: {path}: {msg}", file=sys.stderr)
    sys.exit(1)
with open(path, "rb") as f:
    ident = f.read(16)
    if len(ident) < 16 or ident[:4] != b"\x7fELF":
        die("not an ELF file")
    if ident[4] != 2 or ident[5] != 1:
        die("not a 64-bit little-endian ELF")
    hdr = f.read(48)
    e_type, = struct.unpack_from("<H", hdr, 0)
    if e_type not in (2, 3):
        die("not an executable (ELF type %d)" % e_type)
    e_phoff, = struct.unpack_from("<Q", hdr, 16)
    e_phentsize, e_phnum = struct.unpack_from("<HH", hdr, 38)
    for i in range(e_phnum):
        f.seek(e_phoff + i * e_phentsize)
        p_type, = struct.unpack("<I", f.read(4))
        if p_type == 3:  # PT_INTERP
            die("dynamically linked (it names an ELF interpreter); build it static, "
                "e.g. RUSTFLAGS='-C target-feature=+crt-static' cargo build --release "
                "--target x86_64-unknown-linux-gnu")
PY

if [[ -e "$out" || -L "$out" ]]; then
    [[ -d "$out" && ! -L "$out" ]] || die "$out exists and is not a directory"
    [[ -z "$(ls -A "$out")" ]] || die "$out is not empty; refusing to mix it with the image"
fi

parent=$(dirname "$out")
[[ -d "$parent" ]] || die "parent directory $parent does not exist"
staging=$(mktemp -d "$parent/.image-rootfs.XXXXXX")
trap 'rm -rf "$staging"' EXIT

cp "$bin" "$staging/openshell-sandbox"
chmod 0555 "$staging/openshell-sandbox"
chmod 0755 "$staging"
cmp -s "$bin" "$staging/openshell-sandbox" || die "copy of $bin does not match it"

[[ -d "$out" ]] && rmdir "$out"
mv -T "$staging" "$out"
trap - EXIT
echo "image-rootfs: $out/openshell-sandbox ($(sha256sum "$out/openshell-sandbox" | cut -d' ' -f1))"
