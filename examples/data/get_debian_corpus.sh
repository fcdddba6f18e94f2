#!/usr/bin/env bash
# The standard preset's corpus: English prose from two Debian documentation packages.
#
#   bash examples/data/get_debian_corpus.sh [OUT_DIR]      # default: examples/data/debian
#
# Downloads (apt-get download: no installation, no root needed once the package
# lists exist; run `apt-get update` first on a fresh machine)
#   linux-doc-6.1   the Linux kernel documentation (GPL-2.0)
#   python3.11-doc  the Python 3.11 documentation (PSF License 2.0)
# unpacks them with dpkg-deb, and converts their reStructuredText sources
# (rst_to_text.py: prose paragraphs only, no code, tables or markup) to
#   OUT_DIR/corpus.txt  one paragraph per line, a blank line between documents
# plus each package's copyright file and OUT_DIR/SOURCES (package versions, sha256).
# The corpus is never committed (examples/data/debian/ is git-ignored).
# PYTHON=... chooses the interpreter (default: python3).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/debian}
python=${PYTHON:-python3}
packages=(linux-doc-6.1 python3.11-doc)
sources=(usr/share/doc/linux-doc-6.1/html/_sources usr/share/doc/python3.11/html/_sources)

mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
: > "$work/SOURCES"
for i in "${!packages[@]}"; do
  pkg=${packages[$i]}
  if ! (cd "$work" && apt-get download "$pkg" >/dev/null 2>"$work/apt.err"); then
    cat "$work/apt.err" >&2
    echo "error: apt-get download $pkg failed (on a fresh machine run: apt-get update)" >&2
    exit 2
  fi
  deb=$(ls "$work"/"$pkg"_*.deb)
  dpkg-deb -x "$deb" "$work/$pkg"
  echo "$(basename "$deb") sha256 $(sha256sum "$deb" | cut -d' ' -f1)" >> "$work/SOURCES"
  "$python" "$here/rst_to_text.py" "$work/$pkg/${sources[$i]}" --out "$work/$pkg.txt"
  cp "$(find "$work/$pkg" -name copyright | head -1)" "$out/copyright.$pkg"
done
# documents of both packages, separated by a blank line; written under a temporary name, then renamed
{ cat "$work/linux-doc-6.1.txt"; echo; cat "$work/python3.11-doc.txt"; } > "$out/.corpus.txt.tmp"
mv "$out/.corpus.txt.tmp" "$out/corpus.txt"
cp "$work/SOURCES" "$out/SOURCES"
echo "wrote $out/corpus.txt ($(du -h "$out/corpus.txt" | cut -f1)); licences: $out/copyright.*"
