#!/usr/bin/env bash
# Installs the Python fakes the SES and SMTP tests start on loopback, pinned, into a venv of
# the repository's own (target/python-fakes, which cargo clean removes and git ignores):
#   moto[server]  an independent implementation of Amazon SES v2, in server mode;
#   aiosmtpd      an SMTP server, with the handler in tests/support/smtp_server.py.
# Prints the venv's python on its last line; the tests find it there (or at
# TOWER_IDEMPOTENCY_PYTHON). Running it again only checks the pins.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/python-fakes
pins=("moto[server]==5.2.1" "aiosmtpd==1.4.6")

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import moto.server, aiosmtpd' >/dev/null 2>&1 \
  || [ "$("$venv/bin/python" -c 'import moto; print(moto.__version__)')" != "5.2.1" ] \
  || [ "$("$venv/bin/python" -c 'import aiosmtpd; print(aiosmtpd.__version__)')" != "1.4.6" ]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pins[@]}" >&2
fi
echo "$(pwd)/$venv/bin/python"
