#!/usr/bin/env bash
# Makes sure the active toolchain can build for wasm32-wasip1.
#
# rust-toolchain.toml lists the target, but rustup installs a toolchain's
# `targets` only when it installs the toolchain itself: a toolchain that was
# already there (or is linked to another one, as machines often have for a
# pinned version) keeps only its host target, and the first wasm build fails
# with "can't find crate for `core`". So every recipe that builds for wasm
# calls this first.
set -euo pipefail
target=wasm32-wasip1
sysroot=$(rustc --print sysroot)
[ -d "$sysroot/lib/rustlib/$target/lib" ] && exit 0
echo "wasm-target: the active toolchain ($(rustc --version)) lacks $target; installing it" >&2
if ! rustup target add "$target" >&2; then
  cat >&2 <<MSG
wasm-target: could not install the $target target into the toolchain at
  $sysroot
Run \`rustup target add $target\` in this directory (the toolchain is pinned by
rust-toolchain.toml); if rustup refuses because the toolchain is a custom link,
install the pinned one instead: \`rustup toolchain install $(sed -n 's/^channel = "\(.*\)"$/\1/p' rust-toolchain.toml) --target $target\`.
MSG
  exit 1
fi
[ -d "$sysroot/lib/rustlib/$target/lib" ] || { echo "wasm-target: rustup reported success but $sysroot/lib/rustlib/$target is still missing" >&2; exit 1; }
