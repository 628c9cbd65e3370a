#!/usr/bin/env bash
# Set up everything shardsmith needs on a fresh Debian/Ubuntu machine with Python 3.11:
# Debian packages (image codecs for pillow-simd, AWS CLI), a .venv with the pinned requirements,
# and pillow-simd installed last (torchvision and others pull plain Pillow back in).
# Idempotent: a stamp file records a finished set-up for the current requirements.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
stamp="$VENV/.shardsmith-setup-$(cat envs/requirements.txt envs/energon.txt tools/setup.sh | sha256sum | cut -c1-16)"
[ -f "$stamp" ] && exit 0

SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
apt_pkgs=(libjpeg62-turbo-dev zlib1g-dev libpng-dev libwebp-dev libtiff-dev liblcms2-dev libfreetype-dev
          awscli make gcc)
missing=()
for p in "${apt_pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    || DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
       "${missing[@]/libjpeg62-turbo-dev/libjpeg-dev}"
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
pip install --upgrade pip wheel setuptools
# torch first, from the versions pinned here, so open-clip-torch does not pull a larger build.
pip install torch==2.14.1 torchvision==0.29.1
pip install -r envs/requirements.txt
# Megatron-Energon without its s3fs pin (see envs/energon.txt): the tests read the built dataset with its loader.
pip install --no-deps -r envs/energon.txt
# pillow-simd last: it shares PIL/ with Pillow. AVX2 build where the CPU has it; plain Pillow otherwise.
if grep -q avx2 /proc/cpuinfo 2>/dev/null; then
  if CC="cc -mavx2" pip install --force-reinstall --no-deps --no-binary pillow-simd pillow-simd==12.1.1.post0; then
    :
  else
    echo "setup: pillow-simd did not build; keeping plain Pillow" >&2
  fi
else
  echo "setup: CPU has no AVX2; keeping plain Pillow" >&2
fi
# the package itself, editable: `python -m shardsmith` and the jobs import the code of this checkout
pip install --no-deps --no-build-isolation -e .
"$VENV/bin/python" -c "import PIL, PIL.Image; print('setup: PIL', PIL.__version__)"
command -v aws >/dev/null && aws --version || true
rm -f "$VENV"/.shardsmith-setup-*
touch "$stamp"
echo "setup: done"
