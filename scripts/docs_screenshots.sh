#!/usr/bin/env bash
# Look at the built docs as a person would, offline: headless Chromium (Debian: apt-get install chromium) opens the
# index, an API page and the search page for "FedNTD", writes a PNG of each into the folder given (default: a new
# temporary folder), and checks that the search lists results. Build first: bash scripts/docs.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
HTML="$(pwd)/${DOCS_OUT:-docs/_build/html}"
OUT="${1:-$(mktemp -d -t fl_docs_shots.XXXXXX)}"
mkdir -p "$OUT"
CHROME="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
if [ -z "$CHROME" ]; then
  echo "no Chromium found: apt-get install chromium" >&2
  exit 2
fi
[ -f "$HTML/index.html" ] || { echo "no $HTML/index.html: run bash scripts/docs.sh first" >&2; exit 2; }
# --no-sandbox: Chromium refuses to run as root with its sandbox; nothing but local files is opened.
FLAGS=(--headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,1400 --virtual-time-budget=8000)
shoot() {  # name, page (relative to the site)
  "$CHROME" "${FLAGS[@]}" --screenshot="$OUT/$1.png" "file://$HTML/$2" >/dev/null 2>&1
  echo "$OUT/$1.png"
}
shoot index index.html
shoot api_methods _generated/api/fl_lightning.methods.html
shoot methods methods.html
shoot search "search.html?q=FedNTD"
# The search page's text once its script ran: the results it lists for FedNTD.
"$CHROME" "${FLAGS[@]}" --dump-dom "file://$HTML/search.html?q=FedNTD" 2>/dev/null > "$OUT/search.html"
hits="$(grep -o '<li[^>]*>' "$OUT/search.html" | grep -c 'kind-' || true)"
echo "search for FedNTD: $hits results listed ($OUT/search.html)"
[ "$hits" -gt 0 ]
