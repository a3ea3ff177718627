#!/bin/bash
# Issue 48, point 5: recorded runs and tables out of docs/ into records/ (re-runnable: moves whatever is still there).
set -e
cd "${1:-.}"
mkdir -p records/lab records/reviewer
[ -d docs/gallery/data ] && git mv docs/gallery/data records/gallery 2>/dev/null || { [ -d docs/gallery/data ] && for f in $(git ls-files docs/gallery/data); do mkdir -p "records/gallery/$(dirname "${f#docs/gallery/data/}")"; git mv "$f" "records/gallery/${f#docs/gallery/data/}"; done; }
for study in sensitivity dynamics inference; do
  for d in $(git ls-files "docs/$study" | cut -d/ -f3 | sort -u); do
    mkdir -p "records/$study"
    if [ -e "records/$study/$d" ]; then
      for f in $(git ls-files "docs/$study/$d"); do mkdir -p "records/$study/$(dirname "${f#docs/$study/}")"; git mv "$f" "records/$study/${f#docs/$study/}"; done
    else
      git mv "docs/$study/$d" "records/$study/$d"
    fi
  done
done
for f in $(git ls-files docs/lab/runs); do mkdir -p "records/lab/runs/$(dirname "${f#docs/lab/runs/}")"; git mv "$f" "records/lab/runs/${f#docs/lab/runs/}"; done
for f in $(git ls-files 'docs/reviewer/*'); do git mv "$f" "records/reviewer/${f#docs/reviewer/}"; done
rmdir records/reviewer 2>/dev/null || true
find docs -type d -empty -delete 2>/dev/null || true
